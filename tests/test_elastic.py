"""Elastic aggregation: the server step by hand and against FL-bench's, the clients' sensitivity by hand and in
both engines."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fedagg.aggregators.elastic import Elastic
from fedagg.aggregators.inputs import RoundInputs
from fedagg.clients.client import ClientData
from fedagg.clients.sensitivity import Sensitivity
from fedagg.clients.trainer import LocalSGD
from fedagg.seeding import generator
from fedagg.engines.base import RoundJob
from fedagg.engines.parallel import ParallelEngine
from fedagg.engines.sequential import SequentialEngine
from fedagg.models.flat import ParamLayout, get_buffers, get_params
from fedagg.models.simple import MLP
from test_parallel_engine import TOL, _rel, _setup


def test_paper_step_by_hand():
    w = torch.tensor([1.0, 2.0, 3.0])
    W = torch.tensor([[2.0, 2.0, 1.0], [0.0, 4.0, 3.0]])  # Δ = (1, 0, -2) and (-1, 2, 0)
    omega = torch.tensor([[0.2, 0.0, 1.0], [0.6, 0.4, 0.0]])
    inputs = RoundInputs.of(w, W, num_samples=torch.tensor([1, 3]), sensitivity=omega)
    out = Elastic(tau=0.5).aggregate(inputs)
    # p = (1/4, 3/4); Ω = (0.5, 0.3, 0.25), max 0.5; ζ = 1.5 - Ω/0.5 = (0.5, 0.9, 1.0); Σ p Δ = (-0.5, 1.5, -0.5)
    torch.testing.assert_close(out.params, w + torch.tensor([0.5 * -0.5, 0.9 * 1.5, 1.0 * -0.5]))
    assert out.weights.tolist() == pytest.approx([0.25, 0.75])
    zero = Elastic(tau=0.5).aggregate(RoundInputs.of(w, W, sensitivity=torch.zeros(2, 3)))  # no sensitivity at all
    torch.testing.assert_close(zero.params, w + 1.5 * (W - w).mean(0))


def flbench_aggregate(global_params, local_params, sensitivities, weights, tau):
    """KarhouTam/FL-bench@06e658b src/server/elastic.py:32-51 (aggregate_client_updates), with its clients'
    `diff = W_global - W_local` (return_diff = True) and one sensitivity per parameter tensor."""
    weights = torch.tensor(weights) / sum(weights)
    sensitivities = torch.stack(sensitivities, dim=-1)
    aggregated_sensitivity = torch.sum(sensitivities * weights, dim=-1)
    max_sensitivity = sensitivities.max(dim=-1)[0]
    zeta = 1 + tau - aggregated_sensitivity / max_sensitivity
    out = []
    for i, (global_param, coef) in enumerate(zip(global_params, zeta)):
        diffs = torch.stack([global_param - local[i] for local in local_params], dim=-1)
        aggregated = torch.sum(diffs * weights, dim=-1)
        out.append(global_param - coef * aggregated)
    return out


def test_fl_bench_variant_is_fl_benchs_server_step():
    g = torch.Generator().manual_seed(3)
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
    layout = ParamLayout.of(model)
    tensors = [p.detach() for p in model.parameters()]
    w = get_params(model)
    W = w + 0.1 * torch.randn(3, w.numel(), generator=g)
    omega = torch.rand(3, len(tensors), generator=g)
    sizes = [5, 1, 4]
    out = Elastic(tau=0.5, variant="fl_bench").aggregate(
        RoundInputs.of(w, W, num_samples=torch.tensor(sizes), layout=layout, sensitivity=omega))
    locals_ = [[W[k, s].view_as(t) for s, t in zip(layout.slices, tensors)] for k in range(3)]
    theirs = flbench_aggregate(tensors, locals_, list(omega), sizes, 0.5)
    torch.testing.assert_close(out.params, torch.cat([t.reshape(-1) for t in theirs]), rtol=1e-6, atol=1e-7)


X = torch.tensor([[1.0, -1.0], [2.0, 0.5], [0.0, 3.0], [-1.0, 1.0]])
Y = torch.tensor([0, 1, 1, 0])


def _linear_round(spec, trainer_kw, rounds=1):
    torch.manual_seed(0)
    model = nn.Linear(2, 3)
    start = get_params(model)
    trainer = LocalSGD(**trainer_kw)
    trainer.sensitivity = spec
    data = SimpleNamespace(device=torch.device("cpu"), augment=False, train_x=X, train_y=Y, prepare=lambda x: x)
    data.train_images = lambda idx: data.train_x[idx]
    client = ClientData(0, torch.arange(4), torch.arange(0))
    outs = [SequentialEngine().train_round(RoundJob(model, trainer, data, [client], start.clone(), get_buffers(model),
                                                    lr=trainer_kw["lr"], seed=0, round=r)) for r in range(1, rounds + 1)]
    return start, outs, trainer


def test_client_sensitivity_by_hand_over_two_steps_and_kept_into_the_next_round():
    mu, lr = 0.9, 0.1
    start, outs, trainer = _linear_round(Sensitivity(mu), dict(lr=lr, batch_size=2, local_epochs=1), rounds=2)
    ref = nn.Linear(2, 3)
    omega = torch.zeros(start.numel())
    for r in (1, 2):
        with torch.no_grad():
            ref.weight.copy_(start[:6].view(3, 2))
            ref.bias.copy_(start[6:])
        for batch in torch.randperm(4, generator=generator(0, "batches", 0, r)).split(2):
            out = ref(X[batch])
            g_sens = torch.autograd.grad(out.pow(2).sum(1).mean(), list(ref.parameters()))  # ∂ mean ||f(x)||² / ∂θ
            omega = mu * omega + (1 - mu) * torch.cat([g.reshape(-1) for g in g_sens]).abs()
            g_loss = torch.autograd.grad(nn.functional.cross_entropy(ref(X[batch]), Y[batch]), list(ref.parameters()))
            with torch.no_grad():
                for p, g in zip(ref.parameters(), g_loss):
                    p -= lr * g
        torch.testing.assert_close(outs[r - 1].sensitivity[0], omega, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(trainer.sensitivities[0], omega, rtol=1e-5, atol=1e-7)


def test_fl_bench_sensitivity_is_the_squared_norm_of_each_tensors_loss_gradient():
    """FL-bench@06e658b src/client/elastic.py:36-55: per parameter tensor, mu * s + (1 - mu) * ||∂ℓ/∂θ_i||²."""
    mu = 0.95
    start, outs, _ = _linear_round(Sensitivity(mu, of="loss", per="tensor"), dict(lr=0.1, batch_size=4, local_epochs=1))
    ref = nn.Linear(2, 3)
    with torch.no_grad():
        ref.weight.copy_(start[:6].view(3, 2))
        ref.bias.copy_(start[6:])
    order = torch.randperm(4, generator=generator(0, "batches", 0, 1))
    nn.functional.cross_entropy(ref(X[order]), Y[order]).backward()
    sensitivity = torch.zeros(2)
    grad_norms = [torch.norm(p.grad.data) ** 2 for p in ref.parameters()]
    for i in range(len(grad_norms)):
        sensitivity[i] = mu * sensitivity[i] + (1 - mu) * grad_norms[i].abs()
    torch.testing.assert_close(outs[0].sensitivity[0], sensitivity, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("spec", [Sensitivity(0.9), Sensitivity(0.9, of="loss", per="tensor")])
def test_both_engines_measure_the_same_sensitivities(spec):
    model, data, clients = _setup(MLP, 1, 8, [7, 26, 13, 40], False)  # partial batches: filled up in parallel
    start = get_params(model), get_buffers(model)
    trainers, results = [], []
    for engine in (SequentialEngine(), ParallelEngine(chunk_size=3)):
        trainer = LocalSGD(lr=0.05, momentum=0.9, batch_size=6, local_epochs=2)
        trainer.sensitivity = spec
        trainers.append(trainer)
        results.append([engine.train_round(RoundJob(model, trainer, data, chosen, start[0].clone(), start[1].clone(),
                                                    lr=0.05, seed=3, round=r))
                        for r, chosen in ((1, clients[:2]), (2, clients))])
    for s, p in zip(*results):
        assert s.sensitivity.shape == p.sensitivity.shape == (len(s.params), spec.width([q.shape for q in model.parameters()]))
        for k in range(len(s.params)):
            assert _rel(p.params[k], s.params[k]) < TOL
            assert _rel(p.sensitivity[k], s.sensitivity[k]) < 10 * TOL  # gradients: as the momentum in that file
    assert trainers[0].sensitivities.ids() == trainers[1].sensitivities.ids() == [c.id for c in clients]
