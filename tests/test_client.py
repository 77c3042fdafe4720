"""Local SGD: learning-rate schedules, the SGD it runs, persistent optimizer state, validation errors."""

import copy
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fedagg.clients.client import ClientData
from fedagg.clients.trainer import LocalSGD
from fedagg.seeding import generator
from fedagg.engines.base import RoundJob
from fedagg.engines.sequential import SequentialEngine
from fedagg.models.flat import get_buffers, get_params, set_params


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
    [({"lr": 0}, "client.lr=0"), ({"momentum": 1.0}, "client.momentum=1.0"), ({"nesterov": True}, "client.nesterov=true"),
     ({"schedule": "cosine"}, "client.schedule='cosine'"), ({"val_frac": 1.0}, "client.val_frac=1.0"),
     ({"batch_size": 0}, "client.batch_size=0"), ({"milestones": [1.5]}, r"client.milestones=\[1.5\]")],
)
def test_bad_values_name_the_key_and_value(kwargs, key):
    with pytest.raises(ValueError, match=key):
        LocalSGD(**kwargs)


def _data():
    """Four 1-feature samples on the CPU, served as they are: enough to drive one client's SGD by hand."""
    data = SimpleNamespace(device=torch.device("cpu"), augment=False, train_x=torch.tensor([[1.0], [2.0], [3.0], [4.0]]),
                           train_y=torch.tensor([0, 1, 0, 1]), prepare=lambda x: x)
    data.train_images = lambda idx: data.train_x[idx]  # the images as clients see them (no feature noise)
    return data


def _train_once(trainer, model, client, lr=0.1, round=1):
    """One round of `client` from the model's current weights, by the reference engine; the weights it ends with."""
    job = RoundJob(model, trainer, _data(), [client], get_params(model), get_buffers(model), lr=lr, seed=0, round=round)
    return SequentialEngine().train_round(job)


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
    loss = nn.functional.cross_entropy(ref(_data().train_x), _data().train_y)
    grads = torch.autograd.grad(loss, list(ref.parameters()))
    for p, s, g in zip(model.parameters(), start, grads):
        assert torch.allclose(p, s - 0.1 * g, atol=1e-6)


@pytest.mark.parametrize("options", [dict(momentum=0.9, nesterov=True, weight_decay=1e-2), dict(momentum=0.5)])
def test_local_training_is_torch_sgd_over_the_planned_batches_bit_for_bit(options):
    """The shared definition (plan, loss, stacked SGD) run by the reference engine is exactly a plain
    PyTorch loop of torch.optim.SGD over the client's batches, in the order its stream draws them."""
    torch.manual_seed(0)
    x, y = torch.randn(23, 5), torch.randint(0, 3, (23,))
    data = SimpleNamespace(device=torch.device("cpu"), augment=False, train_x=x, train_y=y, prepare=lambda t: t)
    data.train_images = lambda idx: data.train_x[idx]  # the images as clients see them (no feature noise)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    plain = copy.deepcopy(model)
    client = ClientData(4, torch.arange(23), torch.arange(0))
    trainer = LocalSGD(lr=0.1, batch_size=5, local_epochs=2, **options)
    out = SequentialEngine().train_round(RoundJob(model, trainer, data, [client], get_params(model), get_buffers(model),
                                                  lr=0.1, seed=7, round=3))
    opt = torch.optim.SGD(plain.parameters(), lr=0.1, **options)
    g, seen, total = generator(7, "batches", 4, 3), 0, 0.0
    for _ in range(2):
        for batch in torch.randperm(23, generator=g).split(5):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(plain(x[batch]), y[batch])
            loss.backward()
            opt.step()
            total, seen = total + float(loss.detach()) * len(batch), seen + len(batch)
    assert torch.equal(out.params[0], get_params(plain))
    assert out.train_loss[0] == pytest.approx(total / seen, rel=1e-6) and out.local_steps.tolist() == [10]


def test_kept_optimizer_state_carries_momentum_into_the_next_round():
    client = ClientData(3, torch.arange(4), torch.arange(0))
    kept, fresh = LocalSGD(lr=0.1, momentum=0.9, batch_size=4, keep_optimizer_state=True), LocalSGD(lr=0.1, momentum=0.9, batch_size=4)
    results = []
    for trainer in (kept, fresh):
        torch.manual_seed(0)
        model = nn.Linear(1, 2)
        init = get_params(model)
        _train_once(trainer, model, client)
        set_params(model, init)  # the next round starts from the same weights again
        results.append(_train_once(trainer, model, client, round=2).params[0])
    assert 3 in kept.optimizer_states and not fresh.optimizer_states
    assert not torch.allclose(results[0], results[1])  # momentum from round 1 moved round 2 further
