"""FedBN: local normalisation layers by layer type, the authors' server step, both engines, per-client evaluation."""

import csv

import pytest
import torch
from torch import nn

from conftest import compose_config
from fedagg.aggregators.fedbn import FedBN, FedBNClient, local_masks
from fedagg.aggregators.inputs import RoundInputs
from fedagg.clients.objectives import LocalWork
from fedagg.clients.trainer import LocalSGD
from fedagg.engines.base import RoundJob
from fedagg.engines.parallel import ParallelEngine
from fedagg.engines.sequential import SequentialEngine
from fedagg.models.cnns import CNNBN
from fedagg.models.flat import ParamLayout, get_buffers, get_params, set_buffers, set_params
from fedagg.run import train
from test_parallel_engine import TOL, _rel, _setup


class Net(nn.Module):
    """conv -> bn1 -> relu -> fc, with keys the authors' code tells apart by "bn"."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.bn1 = nn.BatchNorm2d(2)
        self.fc = nn.Linear(2 * 2 * 2, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.bn1(self.conv(x))).flatten(1))


def test_normalisation_layers_are_found_by_type():
    model = CNNBN(num_classes=10, in_channels=1, image_size=8)
    params, buffers = local_masks(model)
    layout = ParamLayout.of(model)
    local = [name for name, s in zip(layout.names, layout.slices) if bool(params[s].all())]
    assert local == ["features.1.weight", "features.1.bias", "features.5.weight", "features.5.bias"]
    assert int(params.sum()) == 2 * 16 + 2 * 32 and bool(buffers.all())  # every buffer is a BatchNorm statistic
    group = nn.Sequential(nn.Linear(3, 4), nn.GroupNorm(2, 4), nn.Linear(4, 2), nn.LayerNorm(2))
    p, b = local_masks(group)
    assert p.tolist() == [False] * 16 + [True] * 8 + [False] * 10 + [True] * 4 and b.numel() == 0


def test_a_model_without_normalisation_layers_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^aggregator=fedbn keeps normalisation layers local, but model MLP has none "
                                         r"\(BatchNorm, InstanceNorm, GroupNorm, LayerNorm\); choose a model with them"):
        train(compose_config("rounds=1", "device=cpu", "aggregator=fedbn"), tmp_path)


def communication_fedbn(server, models, client_weights):
    """med-air/FedBN@2fa38ad federated/fed_digits.py:164-175 (mode fedbn): every key without "bn" averaged into the
    server model and copied back into every client; the "bn" keys stay as each client has them."""
    with torch.no_grad():
        for key in server.state_dict().keys():
            if "bn" not in key:
                temp = torch.zeros_like(server.state_dict()[key], dtype=torch.float32)
                for client_idx in range(len(models)):
                    temp += client_weights[client_idx] * models[client_idx].state_dict()[key]
                server.state_dict()[key].data.copy_(temp)
                for client_idx in range(len(models)):
                    models[client_idx].state_dict()[key].data.copy_(server.state_dict()[key])
    return server, models


def test_what_each_client_starts_from_is_the_authors_communication():
    torch.manual_seed(0)
    server = Net()
    half = FedBNClient()
    half.setup(server)
    w, b = get_params(server), get_buffers(server)
    clients = [Net() for _ in range(3)]  # trained models: every parameter and statistic of their own
    for c in clients:
        with torch.no_grad():
            c.bn1.running_mean.uniform_(-1, 1)
            c.bn1.running_var.uniform_(0.5, 2)
    trained = torch.stack([get_params(c) for c in clients])
    for i, c in enumerate(clients):
        half.after_training(i, trained[i], w, LocalWork(3, 0.1, get_buffers(c)))
    agg = FedBN(weighting="uniform", client=half)
    out = agg.aggregate(RoundInputs.of(w, trained, num_samples=torch.tensor([5, 9, 2])))
    _, theirs = communication_fedbn(Net(), clients, [1 / 3] * 3)
    for i, model in enumerate(theirs):
        params, buffers = half.start(i, out.params, b)
        torch.testing.assert_close(params, get_params(model), rtol=0, atol=1e-6)
        torch.testing.assert_close(buffers, get_buffers(model), rtol=0, atol=0)
    never = half.start(7, out.params, b)  # a client never trained: the initial normalisation layers
    layout = ParamLayout.of(server)
    for name, s in zip(layout.names, layout.slices):
        want = (w if name.startswith("bn1") else out.params)[s]
        assert torch.equal(never[0][s], want), name
    assert torch.equal(never[1], b)


def _rounds(engine, model, start, data, clients, trainer):
    return [engine.train_round(RoundJob(model, trainer, data, chosen, start[0].clone(), start[1].clone(), lr=0.05,
                                        seed=3, round=r)) for r, chosen in ((1, clients[:2]), (2, clients))]


def test_both_engines_give_the_same_models_and_local_layers():
    model, data, clients = _setup(CNNBN, 1, 8, [7, 19, 12, 18], True)
    start = get_params(model), get_buffers(model)
    halves = [FedBNClient(), FedBNClient()]
    for half in halves:
        half.setup(model)  # the initial layers, before an engine leaves trained weights in `model`
    trainers = [LocalSGD(lr=0.05, momentum=0.9, batch_size=5, local_epochs=2, objective=half) for half in halves]
    results = [_rounds(engine, model, start, data, clients, trainer)
               for engine, trainer in zip((SequentialEngine(), ParallelEngine(chunk_size=3)), trainers)]
    for r, (s, p) in enumerate(zip(*results), start=1):
        for k in range(len(s.params)):
            assert _rel(p.params[k], s.params[k]) < TOL, f"round {r}, client {k}"
            assert _rel(p.buffers[k], s.buffers[k]) < TOL, f"round {r}, client {k}: statistics"
    ref, par = (t.objective.local for t in trainers)
    assert ref.ids() == par.ids() == [c.id for c in clients]
    assert all(_rel(par[i], ref[i]) < TOL for i in ref.ids())
    # round 2's first two clients started from their own layers: not the global model's
    mask = trainers[0].objective.param_mask
    second = results[0][1]
    own = trainers[0].objective.start(clients[0].id, start[0], start[1])[0]
    assert not torch.equal(own[mask], start[0][mask])
    plain = SequentialEngine().train_round(RoundJob(model, LocalSGD(lr=0.05, momentum=0.9, batch_size=5, local_epochs=2),
                                                    data, clients, start[0].clone(), start[1].clone(), lr=0.05, seed=3,
                                                    round=2))
    assert _rel(second.params[0], plain.params[0]) > 1e-3 and torch.allclose(second.params[2], plain.params[2])


def test_each_client_is_scored_with_its_own_normalisation_layers(tmp_path):
    from fedagg.edge.job_checks import instantiate_parts, settings_from
    from fedagg.loop.assembly import assemble
    from fedagg.loop.evaluation import per_client_accuracy

    overrides = ["rounds=2", "device=cpu", "aggregator=fedbn", "model=cnn_bn", "eval.per_client=true",
                 "clients_per_round=6", "client.local_epochs=1"]
    train(compose_config(*overrides), tmp_path)
    with open(tmp_path / "clients.csv") as f:
        scored = {int(r["client"]): float(r["test_acc"]) for r in csv.DictReader(f) if r["round"] == "2"}
    cfg = compose_config(*overrides)
    fed = assemble(instantiate_parts(cfg, {}), settings_from(cfg), data_root="data", device=torch.device("cpu"))
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    half = fed.trainer.objective
    half.load_state_dict(ckpt["trainer"]["objective"])
    trained = set(half.local.ids())
    assert 6 <= len(trained) < 10  # some clients never trained: they are scored with the initial layers
    differs = 0
    for client in fed.clients:
        params, buffers = half.start(client.id, ckpt["params"], ckpt["buffers"])
        set_params(fed.model, params)
        set_buffers(fed.model, buffers)
        own = float(per_client_accuracy(fed.model, fed.data, [client.test_idx], 1024)[0])
        assert scored[client.id] == pytest.approx(own, abs=1e-12)
        set_params(fed.model, ckpt["params"])
        set_buffers(fed.model, ckpt["buffers"])
        differs += own != float(per_client_accuracy(fed.model, fed.data, [client.test_idx], 1024)[0])
    assert differs > 0  # the global model's layers would have scored them otherwise
