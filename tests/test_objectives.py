"""Client objectives: the terms they add to the local loss and the state they keep."""

from types import SimpleNamespace

import pytest
import torch
from hydra.utils import instantiate
from torch import nn

from conftest import compose_config
from fedagg.aggregators.feddyn import FedDynClient
from fedagg.clients.client import ClientData
from fedagg.clients.objectives import FedProx, LocalWork, Objective
from fedagg.clients.trainer import LocalSGD
from fedagg.seeding import generator
from fedagg.engines.base import RoundJob
from fedagg.engines.sequential import SequentialEngine
from fedagg.models.flat import get_buffers, get_params


def test_fedprox_gradient_is_mu_times_distance_to_global():
    theta = [torch.tensor([1.0, -2.0], requires_grad=True), torch.tensor([[0.5]], requires_grad=True)]
    anchor = [torch.tensor([0.0, 1.0]), torch.tensor([[2.0]])]
    term = FedProx(mu=0.3).penalty(theta, anchor, None)
    assert float(term) == pytest.approx(0.5 * 0.3 * (1 + 9 + 2.25))
    grads = torch.autograd.grad(term, theta)
    assert torch.allclose(grads[0], 0.3 * torch.tensor([1.0, -3.0]))
    assert torch.allclose(grads[1], 0.3 * torch.tensor([[-1.5]]))


def test_feddyn_penalty_and_state_update():
    dyn = FedDynClient(alpha=0.5)
    work = LocalWork(steps=3, lr=0.1)
    w = torch.tensor([1.0, 1.0, 1.0])
    assert torch.equal(dyn.client_state(4, w), torch.zeros(3))  # never trained: zero gradient state
    assert dyn.after_training(4, torch.tensor([2.0, 0.0, 1.0]), w, work) is None  # sends nothing
    g = dyn.client_state(4, w)
    assert torch.allclose(g, -0.5 * torch.tensor([1.0, -1.0, 0.0]))
    theta = [torch.tensor([3.0, 1.0, 1.0])]
    # -<g, theta> + alpha/2 ||theta - w||^2 = -(-0.5*3 + 0.5*1) + 0.25*4
    assert float(dyn.penalty(theta, [w], [g])) == pytest.approx(1.0 + 1.0)
    dyn.after_training(4, torch.tensor([1.0, 1.0, 3.0]), w, work)
    assert torch.allclose(dyn.client_state(4, w), g - 0.5 * torch.tensor([0.0, 0.0, 2.0]))
    assert torch.equal(dyn.client_state(5, w), torch.zeros(3))  # other ids keep their own state
    fresh = FedDynClient(alpha=0.5)
    fresh.load_state_dict(dyn.state_dict())
    assert torch.equal(fresh.client_state(4, w), dyn.client_state(4, w))


X, Y = torch.tensor([[1.0], [2.0], [3.0], [4.0]]), torch.tensor([0, 1, 0, 1])


def test_local_step_with_fedprox_adds_mu_times_distance_to_the_gradient():
    torch.manual_seed(0)
    model = nn.Linear(1, 2)
    start = [p.detach().clone() for p in model.parameters()]
    trainer = LocalSGD(lr=0.1, batch_size=2, local_epochs=1, objective=FedProx(mu=0.7))
    client = ClientData(0, torch.arange(4), torch.arange(0))
    data = SimpleNamespace(device=torch.device("cpu"), augment=False, train_x=X, train_y=Y, prepare=lambda x: x)
    data.train_images = lambda idx: data.train_x[idx]  # the images as clients see them (no feature noise)
    job = RoundJob(model, trainer, data, [client], get_params(model), get_buffers(model), lr=0.1, seed=0, round=1)
    SequentialEngine().train_round(job)
    order = torch.randperm(4, generator=generator(0, "batches", 0, 1))  # the client's own batch stream
    ref = nn.Linear(1, 2)
    with torch.no_grad():
        for p, s in zip(ref.parameters(), start):
            p.copy_(s)
    for batch in order.split(2):  # two plain SGD steps on CE + 0.7/2 ||theta - start||^2
        loss = nn.functional.cross_entropy(ref(X[batch]), Y[batch])
        grads = torch.autograd.grad(loss, list(ref.parameters()))
        with torch.no_grad():
            for p, gr, s in zip(ref.parameters(), grads, start):
                p -= 0.1 * (gr + 0.7 * (p - s))
    for p, r in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, r, atol=1e-6)


@pytest.mark.parametrize("name, cls", [("none", Objective), ("fedprox", FedProx)])
def test_objective_group_composes(name, cls):
    cfg = compose_config(f"client/objective={name}")
    trainer = instantiate(cfg.client)
    assert type(trainer.objective) is cls


def test_bad_mu_names_the_key():
    with pytest.raises(ValueError, match=r"client.objective.mu=-1"):
        FedProx(mu=-1)
