"""The contract every `conf/aggregator/*.yaml` keeps, checked for each of them.

A new method is covered by adding its YAML: it instantiates to a ready object whose YAML
and constructor agree, reports weights that are non-negative and sum to 1, keeps per-client
state by client id (listing a round's clients in another order changes nothing), survives a
state_dict round trip through torch.save, and resumes bit for bit inside the round loop.
What a round hands it is built from its own declaration (`needs`), as the loop's provider does.
"""

import csv
import inspect
import io
import math
import os
import signal
from dataclasses import replace

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf
from torch import nn

from conftest import CONF, compose_config
from fedagg import Aggregator, RoundInputs, ServerData
from fedagg.aggregators.inputs import ClientSetup
from fedagg.clients.objectives import LocalWork
from fedagg.clients.trainer import LocalSolver
from fedagg.models.adapters import LoRA
from fedagg.models.flat import ParamLayout, get_buffers, get_params
from fedagg.run import train

NAMES = sorted(p.stem for p in (CONF / "aggregator").glob("*.yaml"))
NUM_CLIENTS, NUM_CLASSES = 7, 3
ROUNDS = [[0, 2, 5, 6], [5, 1, 2], [3, 6, 0, 4, 1]]  # partial participation: who takes part in rounds 1-3
# a rule of the asynchronous server steps on `buffer_size` arrivals: one at a time (FedAsync), or a buffer of them
ONE_AT_A_TIME = [[2], [5], [2]]
ASYNC_RUN = ["server=async", "clock=lognormal", "server.concurrency=6"]  # what such a rule runs with
NEEDS_MODEL = {"fedbn": ["model=cnn_bn"]}  # a method that refuses the default MLP: the model it needs
ADAPTER_RUN = ["adapter=lora", "adapter.rank_choices=[2,3,4]"]  # what a rule on low-rank adapters runs with
LR, SOLVER = 0.05, LocalSolver(momentum=0.0, nesterov=False, weight_decay=0.0, proximal_mu=0.0, keeps_momentum=False)


def make(name: str) -> Aggregator:
    return instantiate(compose_config(f"aggregator={name}").aggregator)


class Net(nn.Module):
    """Two layers with a BatchNorm between: a model a server-data method can train on."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, NUM_CLASSES))

    def forward(self, x):
        return self.net(x)


def rounds_of(agg: Aggregator) -> list[list[int]]:
    return ONE_AT_A_TIME if agg.asynchronous and agg.buffer_size == 1 else ROUNDS


def run_overrides(name: str) -> list[str]:
    """What a run of the rule needs beside the common settings: the asynchronous server, adapters, or nothing."""
    agg = make(name)
    return ASYNC_RUN if agg.asynchronous else ["clients_per_round=6", *(ADAPTER_RUN if agg.needs.adapters else [])]


class Federation:
    """Seeded client models for ROUNDS (an asynchronous rule's: also their start models and staleness), and the
    declared extras a provider would give."""

    def __init__(self, seed: int = 0, rounds: list[list[int]] = ROUNDS, adapters: bool = False,
                 frozen_a: bool = False) -> None:
        self.rounds = rounds
        g = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.model = Net()
        self.layout, self.base = ParamLayout.of(self.model), None
        if adapters:  # a rule on low-rank adapters: the model's adapters (unequal ranks, padded to 3) and its base
            held = LoRA(rank=2, ranks=[1, 3, 2, 3, 1, 2, 3]).apply(self.model, NUM_CLIENTS, seed, frozen_a)
            self.layout = replace(ParamLayout.of(self.model), adapters=held.layout)
            self.base = held.base.vector()
        self.w0 = get_params(self.model)
        p = self.w0.numel()
        self.deltas = [0.1 * torch.randn(len(ids), p, generator=g) for ids in rounds]
        self.all_num_samples = torch.randint(5, 40, (NUM_CLIENTS,), generator=g)
        self.hist = torch.stack([torch.bincount(torch.randint(0, NUM_CLASSES, (int(n),), generator=g),
                                                minlength=NUM_CLASSES) for n in self.all_num_samples]).float()
        self.val_acc = [torch.rand(len(ids), generator=g) * 0.8 + 0.1 for ids in rounds]
        self.steps = [torch.randint(1, 9, (len(ids),), generator=g) for ids in rounds]
        self.staleness = [torch.randint(0, 6, (len(ids),), generator=g) for ids in rounds]
        self.start_shift = [0.05 * torch.randn(len(ids), p, generator=g) for ids in rounds]
        self.server = (torch.randn(24, 4, generator=g), torch.randint(0, NUM_CLASSES, (24,), generator=g))

    def inputs(self, agg: Aggregator, r: int, w: torch.Tensor, order: list[int] | None = None) -> RoundInputs:
        """Round r (0-based) from global w, its clients listed in `order` (positions into ROUNDS[r])."""
        order = torch.tensor(order if order is not None else range(len(self.rounds[r])))
        ids = torch.tensor(self.rounds[r])[order]
        needs = agg.needs
        server = None
        if needs.server_data:
            buffers = {n: b.clone() for n, b in self.model.named_buffers()}
            server = ServerData(self.server[0], self.server[1], self.model, buffers)
        trained, steps = w + self.deltas[r][order], self.steps[r][order]
        payloads = {}
        if needs.client_half is not None:  # what the half sends after each client's local steps
            needs.client_half.setup(self.model)  # as the run does once its model is built
            buffers = get_buffers(self.model)
            sent = [needs.client_half.after_training(int(i), row, w, LocalWork(int(s), LR, buffers))
                    for i, row, s in zip(ids, trained, steps)]
            payloads = {key: torch.stack([x[key] for x in sent]) for key in sent[0]} if sent[0] else {}
        sensitivity = None
        if needs.sensitivity is not None:  # what local training measured, per client of the round
            width = needs.sensitivity.width(list(self.layout.shapes))
            sensitivity = torch.rand(len(self.rounds[r]), width, generator=torch.Generator().manual_seed(r))[order]
        arrivals = {}
        if agg.asynchronous:  # each arrival started from an older model, some server steps ago
            start = w + self.start_shift[r][order]
            trained = start + self.deltas[r][order]
            arrivals = {"start_params": start, "staleness": self.staleness[r][order]}
        if needs.buffers:
            buffers = get_buffers(self.model)
            arrivals.update(global_buffers=buffers, client_buffers=buffers + 0.1 * self.deltas[r][order, :1])
        return RoundInputs(
            global_params=w, client_params=trained, num_samples=self.all_num_samples[ids], sensitivity=sensitivity,
            client_ids=ids, round=r + 1, layout=self.layout, all_num_samples=self.all_num_samples,
            val_acc=self.val_acc[r][order] if needs.val_acc else None,
            label_hist=self.hist[ids] if needs.label_hist else None,
            global_label_hist=self.hist.sum(0) if needs.label_hist else None,
            server=server, local_steps=steps if needs.local_steps else None,
            local_lr=LR if needs.local_steps else None, local_solver=SOLVER if needs.local_steps else None,
            payloads=payloads, base=self.base if needs.frozen_a else None, **arrivals,
        )


def federation_for(agg: Aggregator) -> Federation:
    return Federation(rounds=rounds_of(agg), adapters=agg.needs.adapters, frozen_a=agg.needs.frozen_a)


def run_rounds(agg: Aggregator, fed: Federation, rounds, orders=None):
    """Aggregate the given rounds from w0; the new globals, weights and diagnostics of each."""
    w, out = fed.w0, []
    for r in rounds:
        res = agg.aggregate(fed.inputs(agg, r, w, None if orders is None else orders[r]))
        w = res.params
        out.append((w, res.weights.clone(), res.metrics, res))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_yaml_instantiates_with_the_constructors_defaults(name):
    cfg = compose_config(f"aggregator={name}").aggregator
    agg = instantiate(cfg)
    assert isinstance(agg, Aggregator)
    defaults = inspect.signature(type(agg).__init__).parameters
    for key, value in OmegaConf.to_container(cfg, resolve=True).items():
        if key == "_target_" or isinstance(cfg[key], DictConfig):
            continue  # a nested part (a client half) is an object of its own
        if key == "display_name":  # how tables name the method: kept on the object, never a constructor argument
            assert agg.display_name == value and value.lower().replace("-", "").replace(" ", "")[:3] in name.replace("_", "")
            continue
        assert key in defaults, f"{name}.yaml sets {key}, which {type(agg).__name__} does not take"
        default = defaults[key].default
        expected = list(default) if isinstance(cfg[key], ListConfig) else default
        assert value == expected, f"{name}.yaml: {key}={value!r} but the constructor's default is {default!r}"


@pytest.mark.parametrize("name", NAMES)
def test_weights_are_a_distribution_and_diagnostics_finite(name):
    agg = make(name)
    fed = federation_for(agg)
    for (w, weights, diagnostics, res), ids in zip(run_rounds(agg, fed, range(len(fed.rounds))), fed.rounds):
        assert weights.shape == (len(ids),) and bool((weights >= 0).all())
        assert float(weights.sum()) == pytest.approx(1.0, abs=1e-5)
        assert w.shape == fed.w0.shape and bool(torch.isfinite(w).all())
        assert all(math.isfinite(v) for v in diagnostics.values()), diagnostics
    buffers = res.weights_for_buffers()
    assert float(buffers.sum()) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_clients_are_known_by_id_not_by_position(name):
    fed = federation_for(make(name))
    listed = run_rounds(make(name), fed, range(len(fed.rounds)))
    orders = [list(reversed(range(len(ids)))) if r % 2 == 0 or len(ids) < 3 else [1, 2, 0]
              for r, ids in enumerate(fed.rounds)]
    shuffled = run_rounds(make(name), fed, range(len(fed.rounds)), orders)
    for (w_a, p_a, _, _), (w_b, p_b, _, _), order in zip(listed, shuffled, orders):
        torch.testing.assert_close(w_b, w_a, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(p_b, p_a[order], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_state_round_trip_through_a_checkpoint_continues_bit_for_bit(name):
    whole = make(name)
    fed = federation_for(whole)
    run_rounds(whole, fed, [0, 1])
    buffer = io.BytesIO()
    torch.save(whole.state_dict(), buffer)
    resumed = make(name)
    resumed.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=False))
    w = fed.w0 + 0.05
    a, b = whole.aggregate(fed.inputs(whole, 2, w)), resumed.aggregate(fed.inputs(resumed, 2, w))
    assert torch.equal(a.params, b.params) and torch.equal(a.weights, b.weights)
    assert a.metrics == b.metrics


def _rows(path):
    """A result file's rows, without the wall-clock column."""
    with open(path) as f:
        return [{k: v for k, v in row.items() if k != "elapsed_s"} for row in csv.DictReader(f)]


class InterruptAtRound2:
    """A tracker that presses Ctrl-C on its own process during round 2."""

    def start(self, run_dir, config, name):
        pass

    def log_image(self, key, path):
        pass

    def log_round(self, round, metrics):
        if round == 2:
            os.kill(os.getpid(), signal.SIGINT)

    def finish(self, summary):
        pass


@pytest.mark.parametrize("name", NAMES)
def test_an_interrupted_run_resumes_bit_for_bit(tmp_path, name):
    base = ["rounds=3", "device=cpu", f"aggregator={name}", *run_overrides(name), "client.momentum=0.9",
            "client.local_epochs=1"]
    try:  # kept momentum is client state a resume must restore, where the method allows it (FedNova does not)
        make(name).check_clients(ClientSetup(LocalSolver(0.9, False, 0.0, 0.0, keeps_momentum=True), 7, 6))
        base.append("client.keep_optimizer_state=true")
    except ValueError:
        pass
    if name == "fedlaw":
        base.append("aggregator.server_epochs=10")  # its 100 server epochs a round add nothing to this check
    base += NEEDS_MODEL.get(name, [])
    interrupting = [*base, f"logger._target_={__name__}.InterruptAtRound2"]
    stopped = train(compose_config(*interrupting), tmp_path / "stopped")
    assert stopped["status"] == "interrupted" and stopped["rounds_completed"] == 2
    assert train(compose_config(*interrupting, "resume=true"), tmp_path / "stopped")["status"] == "completed"
    reference = tmp_path / "reference"
    train(compose_config(*base), reference)
    for f in ("metrics.csv", "weights.csv"):
        assert _rows(tmp_path / "stopped" / f) == _rows(reference / f), f
    a, b = torch.load(tmp_path / "stopped" / "model.pt"), torch.load(reference / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


# each attack beside one of the systems, so that every aggregator meets every attack and every system
ATTACKS_AND_SYSTEMS = [("label_flip", "stragglers"), ("sign_flip", "dropout"), ("gaussian", "availability"),
                       ("alie", "stragglers"), ("ipm", "dropout")]


@pytest.mark.parametrize("attack, system", ATTACKS_AND_SYSTEMS, ids=[f"{a}+{s}" for a, s in ATTACKS_AND_SYSTEMS])
@pytest.mark.parametrize("name", NAMES)
def test_runs_under_every_attack_and_every_system(tmp_path, name, attack, system):
    overrides = ["rounds=2", "device=cpu", f"aggregator={name}", f"attack={attack}", "attack.fraction=0.3",
                 f"system={system}", "num_clients=7", "clients_per_round=6", "client.local_epochs=1"]
    if name == "fedlaw":
        overrides.append("aggregator.server_epochs=5")
    overrides += NEEDS_MODEL.get(name, []) + (ADAPTER_RUN if make(name).needs.adapters else [])
    if make(name).asynchronous:  # on the asynchronous server the clock makes clients slow: no system drops them
        overrides = [*[o for o in overrides if not o.startswith("clients_per_round")], *ASYNC_RUN]
        if system != "availability":
            with pytest.raises(ValueError, match=rf"^system {system.title()} is not allowed with server=async") as err:
                train(compose_config(*overrides), tmp_path)
            assert "\n" not in str(err.value)
            return
    summary = train(compose_config(*overrides), tmp_path)
    assert summary["status"] in ("completed", "diverged") and len(summary["corrupted_clients"]) == 2
    rows = _rows(tmp_path / "weights.csv")
    assert all(int(r["local_steps"]) >= 1 for r in rows)
    for r in {row["round"] for row in rows}:
        assert sum(float(x["weight"]) for x in rows if x["round"] == r) == pytest.approx(1.0, abs=1e-5)
