"""Runs with adapter=lora: the README's command, both engines, stacked runs, checkpoints, refusals.

(An interrupted run of every adapter rule resuming bit for bit is tests/test_aggregator_contract.py's
test_an_interrupted_run_resumes_bit_for_bit, which runs them with adapter=lora.)
"""

from __future__ import annotations

import csv
import math
import shlex
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import compose_config
from fedagg.clients.trainer import LocalSGD
from fedagg.engines.base import RoundJob
from fedagg.engines.parallel import ParallelEngine
from fedagg.models.adapters import LoRA
from fedagg.models.flat import get_buffers, get_params
from fedagg.models.simple import MLP
from fedagg.run import run_experiment, train
from tests.test_parallel_engine import _rel, _setup

README = (Path(__file__).resolve().parents[1] / "docs" / "how-to" / "adapters.md").read_text()  # the adapters page
TOL = 1e-4  # the engines' agreement (tests/test_parallel_engine.py)


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def readme_overrides() -> list[str]:
    line = next(ln for ln in README.splitlines() if ln.startswith("python -m fedagg.run adapter=lora"))
    return shlex.split(line)[3:]


def test_the_readme_command_runs_and_records_what_the_adapters_send(tmp_path, caplog):
    overrides = readme_overrides()
    assert "aggregator=flora" in overrides
    with caplog.at_level("INFO", logger="fedagg"):
        summary = train(compose_config(*overrides, "device=cpu"), tmp_path)
    assert summary["status"] == "completed"
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("LoRA adapters"))
    # the base, the adapters (rank, targets) and the trainable share: the MLP's two Linear layers at ranks 2 to 8
    # (P = 8 (64 + 64) + 8 (64 + 10) of 4810 + P parameters in all)
    assert line.startswith("LoRA adapters (ranks 2-8 by client, alpha 8) on 2 Linear layers: 1616 trainable of 6426 "
                           "parameters (25.15%); base MLP frozen (4810 values, its seeded initialisation)")
    rows = _rows(tmp_path / "metrics.csv")
    assert all(0 < float(r["agg_error"]) < 1 and float(r["agg_effective_rank"]) >= 1 for r in rows)
    weights = _rows(tmp_path / "weights.csv")
    ranks = {int(w["client"]): int(w["rank"]) for w in weights}
    assert set(ranks.values()) <= {2, 4, 8} and len(set(ranks.values())) > 1  # drawn per client
    # FLoRA: every participant downloads everyone's factors, r (d + k) values per layer each (MLP: 64x64, 10x64)
    for r in {w["round"] for w in weights}:
        mine = [ranks[int(w["client"])] for w in weights if w["round"] == r]
        per_rank = (64 + 64) + (10 + 64)
        row = next(x for x in rows if x["round"] == r)
        assert float(row["agg_bits_up"]) == 32 * per_rank * sum(mine)
        assert float(row["agg_bits_down"]) == 32 * per_rank * sum(mine) * len(mine)


@pytest.mark.parametrize("rule", ["fedsa_lora", "flora"])
def test_both_engines_give_the_same_run(tmp_path, rule):
    base = ["rounds=3", "device=cpu", "num_clients=5", "adapter=lora", "adapter.ranks=[2,4,4,3,2]",
            f"aggregator={rule}", "client.momentum=0.9", "checkpoint_every=0"]
    for engine in ("sequential", "parallel"):
        train(compose_config(*base, f"engine={engine}"), tmp_path / engine)
    seq, par = (torch.load(tmp_path / e / "checkpoint.pt", weights_only=False) for e in ("sequential", "parallel"))
    assert _rel(par["params"], seq["params"]) < TOL
    assert seq["base"].numel() > 0 and _rel(par["base"], seq["base"]) < TOL
    for a, b in zip(_rows(tmp_path / "sequential" / "metrics.csv"), _rows(tmp_path / "parallel" / "metrics.csv")):
        assert float(a["test_acc"]) == pytest.approx(float(b["test_acc"]), abs=0.01)


def test_flora_changes_the_base_and_fedsa_lora_keeps_each_clients_b(tmp_path):
    base = ["rounds=2", "device=cpu", "num_clients=4", "adapter=lora", "checkpoint_every=0"]
    train(compose_config(*base, "aggregator=flora"), tmp_path / "flora")
    train(compose_config(*base, "aggregator=fedit"), tmp_path / "fedit")
    train(compose_config(*base, "aggregator=fedsa_lora"), tmp_path / "fedsa")
    flora, fedit, fedsa = (torch.load(tmp_path / d / "checkpoint.pt", weights_only=False)
                           for d in ("flora", "fedit", "fedsa"))
    assert not torch.equal(flora["base"], fedit["base"])  # merged into the base ...
    assert torch.equal(fedit["base"], fedsa["base"])  # ... which the others leave as it was
    kept = fedsa["trainer"]["objective"]["local"]
    assert kept  # each client's B is in the checkpoint's client state
    # model.pt is the plain model with the adapters merged: W0 + (8 / 4) B A for the MLP's first layer
    merged = torch.load(tmp_path / "fedit" / "model.pt")
    a, b = fedit["params"][:4 * 64].view(4, 64), fedit["params"][4 * 64:8 * 64].view(64, 4)
    w0 = fedit["base"][64:64 + 64 * 64].view(64, 64)  # after net.1's bias
    torch.testing.assert_close(merged["net.1.weight"], w0 + 2.0 * b @ a)
    MLP(num_classes=10, in_channels=1, image_size=8).load_state_dict(merged)  # every key, nothing more


def test_stacked_runs_with_bases_of_their_own_equal_each_run_alone():
    runs = []
    for seed in (1, 2):
        model, data, clients = _setup(MLP, 1, 8, [9, 14, 11], augment=False)
        torch.manual_seed(seed)  # each run its own base
        model = MLP(num_classes=10, in_channels=1, image_size=8)
        LoRA(rank=2).apply(model, 13, seed)
        trainer = LocalSGD(lr=0.1, momentum=0.9, batch_size=4, local_epochs=2)
        runs.append((model, data, clients, trainer, seed, get_params(model) + 0.01, get_buffers(model)))

    def job(run):
        model, data, clients, trainer, seed, params, buffers = run
        return RoundJob(model, trainer, data, clients, params.clone(), buffers.clone(), lr=0.1, seed=seed, round=1)

    alone = [ParallelEngine(chunk_size=64).train_round(job(run)) for run in runs]
    stacked = ParallelEngine(chunk_size=64).train_rounds([job(run) for run in runs])
    for a, s in zip(alone, stacked):
        assert torch.equal(s.params, a.params) and torch.equal(s.train_loss, a.train_loss)


def test_the_design_spelling_model_adapter_is_the_adapter_group(tmp_path):
    from fedagg.config.schema import respelled

    assert respelled(["model.adapter=lora", "+model.adapter.rank=2", "model/adapter=none", "++model.adapter.alpha=4",
                      "model.dim=8", "~model.adapter", "adapter.rank=3"]) == [
        "adapter=lora", "adapter.rank=2", "adapter=none", "adapter.alpha=4", "model.dim=8", "~model.adapter",
        "adapter.rank=3"]
    common = ["rounds=2", "device=cpu", "num_clients=4", "aggregator=fedit"]
    spelled = run_experiment([*common, "model.adapter=lora", "model.adapter.rank=2"], tmp_path / "spelled")
    group = run_experiment([*common, "adapter=lora", "adapter.rank=2"], tmp_path / "group")
    assert spelled["config"]["adapter"]["rank"] == 2 and spelled["config"]["adapter"] == group["config"]["adapter"]
    assert spelled["final_test_acc"] == group["final_test_acc"]  # the same run: same operations, same order
    rows = [pd.read_csv(tmp_path / run / "metrics.csv").drop(columns="elapsed_s") for run in ("spelled", "group")]
    pd.testing.assert_frame_equal(*rows, check_exact=True)
    models = [torch.load(tmp_path / run / "model.pt") for run in ("spelled", "group")]
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[1])


@pytest.mark.parametrize("overrides, message", [
    (["aggregator=flora"], "aggregator=flora combines low-rank adapters, but adapter=none trains the whole model"),
    (["adapter=lora", "adapter.ranks=[2,4]"], "adapter.ranks=[2, 4] is not allowed with num_clients=10"),
    (["adapter=lora", "adapter.rank=0"], "adapter.rank=0 is not allowed"),
    (["adapter=lora", "adapter.targets=[nothing]"], "adapter.targets=['nothing'] is not allowed with model MLP"),
    (["adapter=lora", "adapter.ranks=[2,2,2,2,2,2,2,2,2,2]", "adapter.rank_choices=[2]"],
     "adapter.ranks=[2, 2, 2, 2, 2, 2, 2, 2, 2, 2] and adapter.rank_choices=[2] are not allowed together"),
])
def test_bad_adapter_settings_are_one_line_before_any_training(tmp_path, overrides, message):
    with pytest.raises(ValueError) as err:
        run_experiment(["rounds=1", "device=cpu", *overrides], tmp_path)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert not (tmp_path / "metrics.csv").exists()


def test_adapter_runs_stacked_in_a_sweep_equal_each_run_alone(tmp_path):
    from tests.test_drivers import _in_step, assert_same_run

    common = ["engine=parallel", "device=cpu", "num_clients=5", "rounds=2", "adapter=lora", "adapter.ranks=[2,4,4,3,2]"]
    runs = [["aggregator=flora", "seed=0"], ["aggregator=fedsa_lora", "seed=1"], ["aggregator=flora", "seed=2"]]
    for k, run in enumerate(runs):
        assert train(compose_config(*common, *run), tmp_path / "alone" / str(k))["status"] == "completed"
    outcomes, _, _ = _in_step(tmp_path / "stacked", [compose_config(*common, *run) for run in runs])
    assert [o["status"] for o in outcomes] == ["completed"] * len(runs)
    for k in range(len(runs)):  # each run's own base (FLoRA changes it), trained together with the others'
        assert_same_run(tmp_path / "stacked" / str(k), tmp_path / "alone" / str(k))


def test_compression_and_privacy_act_on_the_adapters_alone(tmp_path):
    """channel=[topk,dp] on FedIT: top-k keeps ⌈0.01 P⌉ of the adapters' P = 808 values (rank 4 on the digits MLP:
    4 (64 + 64) + 4 (10 + 64)), each with its ⌈log2 P⌉-bit index; DP's ε is the one the same sampling and noise
    give any model (a run of the whole model with the same channel)."""
    common = ["rounds=2", "device=cpu", "num_clients=5", "channel=[topk,dp]", "checkpoint_every=0"]
    train(compose_config(*common, "adapter=lora", "aggregator=fedit"), tmp_path / "lora")
    train(compose_config(*common, "aggregator=fedavg"), tmp_path / "whole")
    lora, whole = _rows(tmp_path / "lora" / "metrics.csv"), _rows(tmp_path / "whole" / "metrics.csv")
    p = 4 * (64 + 64) + 4 * (10 + 64)
    assert all(int(r["bits_up"]) == 5 * math.ceil(0.01 * p) * (32 + math.ceil(math.log2(p))) for r in lora)
    assert [r["dp_epsilon"] for r in lora] == [r["dp_epsilon"] for r in whole]
    assert all(math.isfinite(float(r["dp_epsilon"])) for r in lora)
