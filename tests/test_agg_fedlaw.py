"""FedLAW on toy problems whose best shrink factor and weights are known in closed form.

Toy: a logistic model with logits (0, x·θ), θ ∈ R^3, on a proxy set whose inputs are the unit
vectors e_j, a fraction q_j of them labelled 1. The cross-entropy decouples per coordinate and
is minimised exactly at θ*_j = logit(q_j). With three linearly independent client vectors W_k,
θ* = Σ_k c_k W_k has one solution c = W^{-T} θ*, so (c > 0) the optimal shrink factor is
γ* = Σ_k c_k and the optimal weights λ* = c / γ*.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedagg import RoundInputs
from fedagg.aggregators.fedlaw import FedLAW
from fedagg.aggregators.inputs import Needs, ServerData
from fedagg.models.flat import ParamLayout, get_buffers, get_params

Q = np.array([0.7, 0.25, 0.6])  # label-1 fraction per unit vector: 14, 5 and 12 of 20
PER = 20
X = torch.eye(3).repeat_interleave(PER, 0)
Y = torch.cat([(torch.arange(PER) < round(q * PER)).long() for q in Q])
W_CLIENTS = np.array([[2.0, -1.0, 0.0], [0.0, -3.0, 1.0], [0.5, 0.5, 1.5]])  # well conditioned (cond ≈ 2.1)
SAMPLES = torch.tensor([1, 1, 2])
FAST = dict(server_batch_size=0, server_lr=0.05, lr_decay_every=100, lr_decay=0.3)  # annealed to the optimum


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Hundreds of Adam steps on 3-element tensors: extra intra-op threads only add synchronisation
    (40x slower on a busy 2-core machine), so this module runs single-threaded and restores the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(3))

    def forward(self, x):
        return torch.stack([torch.zeros(len(x)), x @ self.weight], dim=1)


class SmallBN(nn.Module):
    """A BatchNorm network: the server must use copies of its buffers and leave it untouched."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))

    def forward(self, x):
        return self.net(x)


def run(agg, clients, model, x=X, y=Y, n=SAMPLES, r=1):
    clients = torch.as_tensor(clients, dtype=torch.float32)
    server = ServerData(x, y, model, {name: b.clone() for name, b in model.named_buffers()})
    return agg.aggregate(RoundInputs.of(clients[0] * 0, clients, num_samples=n, round=r, layout=ParamLayout.of(model),
                                        server=server))


def test_closed_form_optimum_check():  # guards the test's own construction
    theta = np.log(Q / (1 - Q))
    c = np.linalg.solve(W_CLIENTS.T, theta)
    assert np.all(c > 0) and 0.7 < c.sum() < 0.8  # interior optimum that shrinks (γ* ≈ 0.75)
    grad = [(F.sigmoid(torch.tensor(theta[j])) - Q[j]).item() for j in range(3)]
    assert np.allclose(grad, 0, atol=1e-6)


def test_learns_the_known_shrink_factor_and_weights():
    c = np.linalg.solve(W_CLIENTS.T, np.log(Q / (1 - Q)))
    gamma_star, lam_star = c.sum(), c / c.sum()
    agg = FedLAW(server_epochs=300, **FAST)
    res = run(agg, W_CLIENTS, Toy())
    new = res.params
    gamma = res.metrics["gamma"]  # reported each round as agg_gamma
    assert gamma == pytest.approx(gamma_star, abs=0.01)
    assert np.allclose(res.weights.numpy(), lam_star, atol=0.01)
    assert np.allclose(new.numpy(), np.log(Q / (1 - Q)), atol=0.01)  # γ Σ λ_k W_k with the learned values
    assert torch.allclose(new, gamma * (res.weights @ torch.tensor(W_CLIENTS, dtype=torch.float32)))


def test_moves_all_weight_to_the_client_that_is_the_optimum():
    clients = W_CLIENTS.copy()
    clients[2] = np.log(Q / (1 - Q))  # client 2 is θ* itself: γ* = 1, λ* = e_2 (a vertex, reached only in the limit)
    agg = FedLAW(server_epochs=300, server_batch_size=0, server_lr=0.05, lr_decay=1.0)
    res = run(agg, clients, Toy())
    assert res.weights[2] > 0.9 and res.metrics["gamma"] == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("init, expected", [("samples", [0.25, 0.25, 0.5]), ("uniform", [1 / 3] * 3)])
def test_starts_from_fedavg_weights_and_no_shrink(init, expected):
    agg = FedLAW(server_epochs=1, server_lr=1e-9, init_weights=init)  # one negligible step: the starting point
    res = run(agg, W_CLIENTS, Toy())
    new = res.params
    assert torch.allclose(res.weights, torch.tensor(expected), atol=1e-6)
    assert res.metrics["gamma"] == pytest.approx(1.0, abs=1e-6)
    assert torch.allclose(new, torch.tensor(expected) @ torch.tensor(W_CLIENTS, dtype=torch.float32), atol=1e-5)


def test_minibatches_with_batchnorm_leave_the_model_alone_and_lower_the_proxy_loss():
    torch.manual_seed(0)
    model = SmallBN().eval()
    x, y = torch.randn(50, 4), torch.randint(0, 3, (50,))
    base = get_params(model)
    clients = base + 0.3 * torch.randn(3, base.numel())
    params_before, buffers_before = get_params(model), get_buffers(model)
    agg = FedLAW(server_epochs=20, server_batch_size=16)  # 50 samples -> 4 shuffled batches of 12-13 per epoch
    res = run(agg, clients, model, x=x, y=y)
    new = res.params
    assert torch.equal(get_params(model), params_before) and torch.equal(get_buffers(model), buffers_before)
    assert not model.training and all(p.grad is None for p in model.parameters())
    assert torch.isfinite(new).all() and torch.isclose(res.weights.sum(), torch.tensor(1.0))

    def proxy_loss(vec):  # in train mode, as the server optimises it
        layout = ParamLayout.of(model)
        params = {n: vec[s].view(sh) for n, s, sh in zip(layout.names, layout.slices, layout.shapes)}
        buffers = {n: b.clone() for n, b in model.named_buffers()}
        model.train()
        out = torch.func.functional_call(model, {**params, **buffers}, (x,))
        model.eval()
        return F.cross_entropy(out, y)

    start = sum(w * c for w, c in zip([0.25, 0.25, 0.5], clients))  # γ = 1, λ = D
    assert proxy_loss(new) < proxy_loss(start)
    again = FedLAW(server_epochs=20, server_batch_size=16)
    assert torch.equal(run(again, clients, model, x=x, y=y).params, new)  # the shuffle is seeded: reproducible, no state
    assert agg.state_dict() == {}


def test_numerical_safety():
    agg = FedLAW(server_epochs=5, server_batch_size=0)
    res = run(agg, np.repeat(W_CLIENTS[:1], 3, axis=0), Toy())  # identical clients: λ has no effect, γ still learned
    same = res.params
    assert torch.isfinite(same).all() and torch.isclose(res.weights.sum(), torch.tensor(1.0))
    res = run(agg, W_CLIENTS[:1], Toy(), n=SAMPLES[:1])
    one = res.params
    assert torch.equal(res.weights, torch.ones(1)) and torch.isfinite(one).all()
    res = run(agg, np.zeros((3, 3)), Toy())
    zero = res.params
    assert torch.equal(zero, torch.zeros(3))


def test_needs_server_data():
    model = Toy()
    with pytest.raises(ValueError, match="reads inputs.server but does not declare it"):
        FedLAW().aggregate(RoundInputs.of(torch.zeros(3), torch.zeros(3, 3), layout=ParamLayout.of(model)))


@pytest.mark.parametrize("kwargs, key", [
    ({"proxy_size": 0}, "proxy_size"), ({"server_epochs": 0}, "server_epochs"), ({"server_epochs": 2.5}, "server_epochs"),
    ({"server_lr": 0}, "server_lr"), ({"betas": [1.0, 0.9]}, "betas"), ({"betas": [0.5]}, "betas"),
    ({"server_batch_size": -1}, "server_batch_size"), ({"lr_decay_every": 0}, "lr_decay_every"),
    ({"lr_decay": 0}, "lr_decay"), ({"lr_decay": 1.5}, "lr_decay"), ({"init_weights": "random"}, "init_weights")])
def test_bad_values_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=rf"aggregator\.{key}="):
        FedLAW(**kwargs)


def test_defaults_are_specs_and_mark_the_run_as_using_extra_data():
    agg = FedLAW()
    assert agg.needs == Needs(server_samples=200, server_data=True) and agg.needs.uses_extra_data
    assert (agg.server_epochs, agg.server_lr, agg.betas) == (100, 0.01, (0.5, 0.999))
    assert "reference only" in open("conf/aggregator/fedlaw.yaml").read()
