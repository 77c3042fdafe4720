"""Local SGD: learning-rate schedules, persistent optimizer state, validation errors."""

import pytest
import torch
from torch import nn

from fedagg.clients.trainer import ClientData, LocalSGD


def test_exponential_schedule_decays_per_round():
    t = LocalSGD(lr=0.1, schedule="exponential", decay=0.99)
    assert t.lr_at(1, 100) == pytest.approx(0.1)
    assert t.lr_at(11, 100) == pytest.approx(0.1 * 0.99**10)


def test_multistep_schedule_steps_after_fractions_of_the_rounds():
    t = LocalSGD(lr=1.0, schedule="multistep", milestones=[0.5, 0.75], gamma=0.1)
    assert [t.lr_at(r, 100) for r in (1, 50, 51, 75, 76, 100)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01])


def test_constant_schedule():
    assert LocalSGD(lr=0.3).lr_at(77, 100) == 0.3


@pytest.mark.parametrize(
    "kwargs, key",
    [({"lr": 0}, "client.lr=0"), ({"momentum": 1.0}, "client.momentum=1.0"), ({"nesterov": True}, "client.nesterov=True"),
     ({"schedule": "cosine"}, "client.schedule='cosine'"), ({"val_frac": 1.0}, "client.val_frac=1.0"),
     ({"batch_size": 0}, "client.batch_size=0"), ({"milestones": [1.5]}, r"client.milestones=\[1.5\]")],
)
def test_bad_values_name_the_key_and_value(kwargs, key):
    with pytest.raises(ValueError, match=key):
        LocalSGD(**kwargs)


class _Data:
    """Four 1-feature samples on the CPU; enough to drive one client's SGD by hand."""

    device = torch.device("cpu")

    def __init__(self):
        self.x = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
        self.y = torch.tensor([0, 1, 0, 1])

    def train_batch(self, idx, generator=None):
        return self.x[idx], self.y[idx]


def _train_once(trainer, model, client):
    return trainer.train(model, client, _Data(), lr=0.1, generator=torch.Generator().manual_seed(0))


def test_one_full_batch_step_equals_manual_sgd():
    torch.manual_seed(0)
    model = nn.Linear(1, 2)
    start = [p.detach().clone() for p in model.parameters()]
    client = ClientData(0, torch.arange(4), torch.arange(0))
    _train_once(LocalSGD(lr=0.1, batch_size=4, local_epochs=1), model, client)
    ref = nn.Linear(1, 2)
    with torch.no_grad():
        for p, s in zip(ref.parameters(), start):
            p.copy_(s)
    loss = nn.functional.cross_entropy(ref(_Data().x), _Data().y)
    grads = torch.autograd.grad(loss, list(ref.parameters()))
    for p, s, g in zip(model.parameters(), start, grads):
        assert torch.allclose(p, s - 0.1 * g, atol=1e-6)


def test_kept_optimizer_state_carries_momentum_into_the_next_round():
    client = ClientData(3, torch.arange(4), torch.arange(0))
    kept, fresh = LocalSGD(lr=0.1, momentum=0.9, batch_size=4, keep_optimizer_state=True), LocalSGD(lr=0.1, momentum=0.9, batch_size=4)
    results = []
    for trainer in (kept, fresh):
        torch.manual_seed(0)
        model = nn.Linear(1, 2)
        init = [p.detach().clone() for p in model.parameters()]
        _train_once(trainer, model, client)
        with torch.no_grad():  # the next round starts from the same weights again
            for p, s in zip(model.parameters(), init):
                p.copy_(s)
        _train_once(trainer, model, client)
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert 3 in kept.optimizer_states and not fresh.optimizer_states
    assert not torch.allclose(results[0], results[1])  # momentum from round 1 moved round 2 further
