"""Client objectives: the terms they add to the local loss and the state they keep."""

import pytest
import torch
from hydra.utils import instantiate
from torch import nn

from conftest import compose_config
from fedagg.clients.trainer import ClientData, LocalSGD
from fedagg.clients.objectives import FedDyn, FedProx, Objective


def test_fedprox_gradient_is_mu_times_distance_to_global():
    theta = [torch.tensor([1.0, -2.0], requires_grad=True), torch.tensor([[0.5]], requires_grad=True)]
    anchor = [torch.tensor([0.0, 1.0]), torch.tensor([[2.0]])]
    term = FedProx(mu=0.3).penalty(theta, anchor, None)
    assert float(term) == pytest.approx(0.5 * 0.3 * (1 + 9 + 2.25))
    grads = torch.autograd.grad(term, theta)
    assert torch.allclose(grads[0], 0.3 * torch.tensor([1.0, -3.0]))
    assert torch.allclose(grads[1], 0.3 * torch.tensor([[-1.5]]))


def test_feddyn_penalty_and_state_update():
    dyn = FedDyn(alpha=0.5)
    w = torch.tensor([1.0, 1.0, 1.0])
    assert torch.equal(dyn.client_state(4, w), torch.zeros(3))  # never trained: zero gradient state
    dyn.after_training(4, torch.tensor([2.0, 0.0, 1.0]), w)
    g = dyn.client_state(4, w)
    assert torch.allclose(g, -0.5 * torch.tensor([1.0, -1.0, 0.0]))
    theta = [torch.tensor([3.0, 1.0, 1.0])]
    # -<g, theta> + alpha/2 ||theta - w||^2 = -(-0.5*3 + 0.5*1) + 0.25*4
    assert float(dyn.penalty(theta, [w], [g])) == pytest.approx(1.0 + 1.0)
    dyn.after_training(4, torch.tensor([1.0, 1.0, 3.0]), w)
    assert torch.allclose(dyn.client_state(4, w), g - 0.5 * torch.tensor([0.0, 0.0, 2.0]))
    assert torch.equal(dyn.client_state(5, w), torch.zeros(3))  # other ids keep their own state
    fresh = FedDyn(alpha=0.5)
    fresh.load_state_dict(dyn.state_dict())
    assert torch.equal(fresh.client_state(4, w), dyn.client_state(4, w))


class _Data:
    device = torch.device("cpu")
    x = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    y = torch.tensor([0, 1, 0, 1])

    def train_batch(self, idx, generator=None):
        return self.x[idx], self.y[idx]


def test_local_step_with_fedprox_adds_mu_times_distance_to_the_gradient():
    torch.manual_seed(0)
    model = nn.Linear(1, 2)
    start = [p.detach().clone() for p in model.parameters()]
    trainer = LocalSGD(lr=0.1, batch_size=2, local_epochs=1, objective=FedProx(mu=0.7))
    client = ClientData(0, torch.arange(4), torch.arange(0))
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(4, generator=torch.Generator().manual_seed(0))
    trainer.train(model, client, _Data(), lr=0.1, generator=g)
    ref = nn.Linear(1, 2)
    with torch.no_grad():
        for p, s in zip(ref.parameters(), start):
            p.copy_(s)
    for batch in order.split(2):  # two plain SGD steps on CE + 0.7/2 ||theta - start||^2
        loss = nn.functional.cross_entropy(ref(_Data.x[batch]), _Data.y[batch])
        grads = torch.autograd.grad(loss, list(ref.parameters()))
        with torch.no_grad():
            for p, gr, s in zip(ref.parameters(), grads, start):
                p -= 0.1 * (gr + 0.7 * (p - s))
    for p, r in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, r, atol=1e-6)


@pytest.mark.parametrize("name, cls", [("none", Objective), ("fedprox", FedProx), ("feddyn", FedDyn)])
def test_objective_group_composes(name, cls):
    cfg = compose_config(f"client/objective={name}")
    trainer = instantiate(cfg.client)
    assert type(trainer.objective) is cls


def test_bad_mu_names_the_key():
    with pytest.raises(ValueError, match=r"client.objective.mu=-1"):
        FedProx(mu=-1)
