"""Every method's local training, stacked beside other runs, gives each run what it gets alone, bit for bit.

Each client objective of conf/client/objective/ and each client half (or kept sensitivity) an aggregator of
conf/aggregator/ declares, found in the configs so that a new method is checked too: three runs of it (their own
global weights, seeds, clients, learning rates) trained three rounds together by one parallel engine, against each
run trained alone by an engine of its own. The runs' steps share vmapped calls of other sizes than alone, so a
client's elements sit at other places of the stacked tensors: any operation whose value at an element depends on
its neighbours there (a reduction over the stacked axis, the scalar tail of a vectorised CPU kernel) shows as a
difference. Batches of 7 leave partial batches; round 1 trains only some clients, so that in the later rounds
clients with and without a previous model (MOON) train side by side.
"""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch.func import vmap

from conftest import CONF
from fedagg.clients.objectives import LANES, Objective, elementwise
from fedagg.clients.trainer import LocalSGD
from fedagg.data.device import shared
from fedagg.engines import _packed
from fedagg.engines.base import RoundJob
from fedagg.engines.parallel import ParallelEngine
from fedagg.models.adapters import LoRA
from fedagg.models.adapters.masks import RankMasks
from fedagg.models.cnns import CNNBN
from fedagg.models.flat import get_buffers, get_params
from fedagg.models.simple import MLP
from tests.test_parallel_engine import _setup

# other settings worth their own check: (config file, overrides)
VARIANTS = [("client/objective/moon", {"projection": "none"}), ("client/objective/fedlc", {"absent": "epsilon"}),
            ("client/objective/feddecorr", {"scale": "paper"}), ("aggregator/elastic", {"variant": "fl_bench"})]


def _node(path: Path, overrides: dict):
    """The YAML as the run composes it (its `${attack.fraction}` read from attack=none)."""
    root = OmegaConf.create({"attack": OmegaConf.load(CONF / "attack" / "none.yaml"),
                             "node": OmegaConf.merge(OmegaConf.load(path), overrides)})
    return root.node


def _client_side(name: str, overrides: dict | None = None):
    """(objective, sensitivity) the method's local training runs with."""
    built = instantiate(_node(CONF / f"{name}.yaml", overrides or {}))
    if name.startswith("aggregator/"):  # a rule with a sensitivity only trains on the plain loss
        return built.needs.client_half or Objective(), built.needs.sensitivity
    return built, None


def _methods() -> list:
    found = []
    for path in sorted((CONF / "client" / "objective").glob("*.yaml")):
        if not OmegaConf.load(path)._target_.endswith("moved_to_aggregator"):  # an old spelling's message
            found.append(f"client/objective/{path.stem}")
    for path in sorted((CONF / "aggregator").glob("*.yaml")):
        half, sensitivity = _client_side(f"aggregator/{path.stem}")
        if type(half) is not Objective or sensitivity is not None:
            found.append(f"aggregator/{path.stem}")
    return [pytest.param(name, {}, id=name) for name in found] + [
        pytest.param(name, o, id=name + "[" + ",".join(f"{k}={v}" for k, v in o.items()) + "]") for name, o in VARIANTS]


SPECS = [([9, 23, 14, 5], 0.05), ([16, 8, 19], 0.1), ([12, 30, 7, 11, 6], 0.02)]  # client sizes, learning rate
# a last client per run with these samples per class (counts whose n^(-1/4) the CPU's vector and scalar code round
# apart: FedLC's calibration), trained for a budget of 3 steps
COUNTS = [65, 90, 95, 130, 139, 2, 0, 1, 3, 4]


def _data(model_cls, sizes: list[int]):
    """`_setup`'s toy data and clients, and a last client holding COUNTS samples per class."""
    model, data, clients = _setup(model_cls, 1, 8, [*sizes, sum(COUNTS)], augment=False)
    y = data.train_y.clone()  # a new tensor: the runs' data tensors are shared, never written in place
    y[clients[-1].train_idx] = torch.repeat_interleave(torch.arange(10), torch.tensor(COUNTS))
    data.train_y = shared(y)
    return data, clients


def _runs(name: str, overrides: dict) -> list[tuple]:
    runs = []
    for i, (sizes, lr) in enumerate(SPECS):
        half, sensitivity = _client_side(name, overrides)
        adapted = name.startswith("aggregator/") and instantiate(_node(CONF / f"{name}.yaml", overrides)).needs.adapters
        model_cls = MLP
        try:
            if not adapted:  # a rule on adapters (FedSA-LoRA) works with the adapted MLP below
                half.setup(MLP(num_classes=10, in_channels=1, image_size=8))
        except ValueError:  # a method for models with normalisation layers (FedBN)
            model_cls = CNNBN
        data, clients = _data(model_cls, sizes)
        torch.manual_seed(20 + i)  # each run its own global weights
        model = model_cls(num_classes=10, in_channels=1, image_size=8)
        if half.sees.projection_head:
            model.add_projection_head(half.sees.projection_head)
        # each run its own frozen base, and clients of unequal ranks (ids 10, 11, ...)
        held = LoRA(rank=2, rank_choices=[1, 2, 3]).apply(model, 16, 3 + i) if adapted else None
        half.setup(model)
        trainer = LocalSGD(lr=lr, momentum=0.5, batch_size=7, local_epochs=2, objective=half)
        trainer.sensitivity = sensitivity
        trainer.rank_masks = RankMasks.of(held.layout, torch.device("cpu")) if held is not None else None
        runs.append((model, trainer, data, clients, lr, 3 + i, (get_params(model), get_buffers(model))))
    return runs


def _job(run, r: int) -> RoundJob:
    model, trainer, data, clients, lr, seed, (params, buffers) = run
    clients = clients[::2] if r == 1 else clients  # round 1: some clients; later, all
    budgets = [10**6] * (len(clients) - 1) + [3]  # no limit but for the last client
    return RoundJob(model, trainer, data, clients, params.clone(), buffers.clone(), lr=lr, seed=seed, round=r,
                    budgets=budgets)


@pytest.mark.parametrize("name,overrides", _methods())
def test_every_method_stacked_beside_other_runs_equals_each_run_alone(name, overrides, monkeypatch):
    monkeypatch.setattr(_packed, "LOOP_MIN_BATCH", 1)  # per-client convolutions (FedBN's CNN): exact kernels
    alone_runs, stacked_runs = _runs(name, overrides), _runs(name, overrides)
    alone = [[ParallelEngine(chunk_size=64).train_round(_job(run, r)) for r in (1, 2, 3)] for run in alone_runs]
    engine = ParallelEngine(chunk_size=64)
    stacked = [engine.train_rounds([_job(run, r) for run in stacked_runs]) for r in (1, 2, 3)]
    for j in range(len(SPECS)):
        for r in range(3):
            a, s = alone[j][r], stacked[r][j]
            pairs = [(s.params, a.params), (s.buffers, a.buffers), (s.train_loss, a.train_loss)]
            assert s.payloads.keys() == a.payloads.keys()
            pairs += [(s.payloads[key], a.payloads[key]) for key in a.payloads]
            if a.sensitivity is not None:
                pairs.append((s.sensitivity, a.sensitivity))
            for got, want in pairs:
                assert torch.equal(got, want), (j, r + 1, float((got - want).abs().max()))


@pytest.mark.parametrize("fn", [F.softplus, lambda t: torch.log1p(t.abs()), torch.sigmoid, lambda t: t.abs().pow(-0.25)],
                         ids=["softplus", "log1p", "sigmoid", "pow"])
def test_an_elementwise_function_of_a_client_does_not_depend_on_the_clients_beside_it(fn):
    """The function and its gradient on one client's values, vmapped beside k - 1 copies of them (k from 1 to 9,
    lengths around the CPU's vector widths): every copy gets what the client gets alone, and what fn gives."""
    torch.manual_seed(0)
    for n in (1, 5, 30, 33, LANES + 3):
        x = torch.randn(n) * 3
        want = fn(x.unsqueeze(0).expand(LANES, n).contiguous())[0]  # an element of a long stack: vectorised
        for k in range(1, 10):
            xs = x.unsqueeze(0).repeat(k, 1).requires_grad_()
            out = vmap(lambda row: elementwise(fn, row))(xs)
            grad, = torch.autograd.grad(out.sum(), xs)
            assert all(torch.equal(out[i], out[0]) and torch.equal(grad[i], grad[0]) for i in range(k)), (n, k)
            one = x.clone().requires_grad_()
            alone = elementwise(fn, one)
            assert torch.equal(out[0], alone) and torch.equal(grad[0], torch.autograd.grad(alone.sum(), one)[0])
            torch.testing.assert_close(out[0], want)  # the function itself, to rounding
