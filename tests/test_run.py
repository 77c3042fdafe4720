"""End to end: composed configs run, write their result files, and reproduce."""

import csv
import json
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, SHARED_DATA, compose_config, needs_mnist
from fedagg.config.settings import Settings
from fedagg.sampling.pool import sample_clients
from fedagg.run import train


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_two_round_run_writes_all_result_files(tmp_path, small_run):
    cfg = compose_config(*small_run)
    summary = train(cfg, tmp_path, choices={"aggregator": "fedavg"})
    assert summary == json.loads((tmp_path / "summary.json").read_text())  # what train returns is what it wrote
    for name in ("metrics.csv", "summary.json", "partition.json", "partition.png", "config.yaml", "model.pt"):
        assert (tmp_path / name).exists(), name
    rows = _rows(tmp_path / "metrics.csv")
    assert [int(r["round"]) for r in rows] == [1, 2]
    for col in ("test_acc", "test_loss", "train_loss", "update_norm", "client_update_norm", "elapsed_s"):
        assert col in rows[0]
    for r in rows:
        # for FedAvg the server step is a convex combination: ||sum p_k d_k|| <= sum p_k ||d_k||
        assert 0 < float(r["update_norm"]) <= float(r["client_update_norm"]) + 1e-6
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["status"] == "completed" and saved["rounds_completed"] == 2
    assert saved["final_test_acc"] == pytest.approx(float(rows[-1]["test_acc"]))
    assert saved["best_test_acc"] == pytest.approx(max(float(r["test_acc"]) for r in rows))
    assert saved["final_test_acc"] > 0.5  # ten classes: chance is 0.1
    # no model was chosen: the digits' default backbone is recorded as if model=mlp had been typed
    assert saved["choices"] == {"aggregator": "fedavg", "model": "mlp"} and saved["config"]["rounds"] == 2
    part = json.loads((tmp_path / "partition.json").read_text())
    assert len(part["clients"]) == 10
    assert sum(c["size"] for c in part["clients"]) == part["total"]
    assert all(sum(c["class_counts"]) == c["size"] for c in part["clients"])


def test_same_seed_same_metrics_and_model(tmp_path, small_run):
    a, b = tmp_path / "a", tmp_path / "b"
    train(compose_config(*small_run), a)
    train(compose_config(*small_run), b)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows]  # noqa: E731
    assert strip(_rows(a / "metrics.csv")) == strip(_rows(b / "metrics.csv"))
    ma, mb = torch.load(a / "model.pt"), torch.load(b / "model.pt")
    assert all(torch.equal(ma[k], mb[k]) for k in ma)


def test_rounds_to_target_is_first_evaluated_round_reaching_it(tmp_path, small_run):
    summary = train(compose_config(*small_run, "target_acc=0.05", "eval_every=2"), tmp_path)
    assert summary["rounds_to_target"] == 2  # evaluated only at round 2 (eval_every) and chance beats 5%
    assert [int(r["round"]) for r in _rows(tmp_path / "metrics.csv")] == [2]


def test_stop_at_target_ends_the_run_at_the_round_that_reaches_it(tmp_path):
    summary = train(compose_config("rounds=6", "device=cpu", "target_acc=0.05", "eval_every=2",
                                   "stop_at_target=true"), tmp_path)
    assert summary["status"] == "completed"
    assert summary["rounds_to_target"] == summary["stopped_at_target"] == summary["rounds_completed"] == 2
    assert [int(r["round"]) for r in _rows(tmp_path / "metrics.csv")] == [2]
    assert {int(r["round"]) for r in _rows(tmp_path / "weights.csv")} == {1, 2}


def test_partial_participation_and_uniform_weighting_run(tmp_path, small_run):
    summary = train(compose_config(*small_run, "clients_per_round=3", "aggregator.weighting=uniform"), tmp_path)
    assert summary["status"] == "completed"
    rows = _rows(tmp_path / "weights.csv")
    sizes = {c["id"]: c["size"] for c in json.loads((tmp_path / "partition.json").read_text())["clients"]}
    chosen = [sorted(int(r["client"]) for r in rows if r["round"] == str(k)) for k in (1, 2)]
    # the seeded sampling stream picks 3 distinct clients a round, and not the same 3 both times here
    assert [len(set(c)) for c in chosen] == [3, 3] and chosen[0] != chosen[1]
    assert chosen == [sample_clients(Settings(seed=0, num_clients=10, clients_per_round=3), r) for r in (1, 2)]
    for r in rows:  # uniform: 1/3 each, whatever the client's size, which weights.csv records beside it
        assert float(r["weight"]) == pytest.approx(1 / 3) and int(r["num_samples"]) == sizes[int(r["client"])]


def test_offline_wandb_run_leaves_a_syncable_folder(tmp_path, small_run, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    summary = train(compose_config(*small_run, "logger=wandb", "logger.mode=offline"), tmp_path)
    assert summary["status"] == "completed"
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("run-*.wandb"))  # the file `wandb sync` uploads


def test_bad_value_fails_before_any_data_is_loaded(tmp_path, small_run):
    with pytest.raises(ValueError, match=r"clients_per_round=11 is not allowed"):
        train(compose_config(*small_run, "clients_per_round=11"), tmp_path)
    assert not (tmp_path / "partition.json").exists()


@pytest.mark.slow  # a CLI subprocess of 10-30 s; the default suite must stay under 10 minutes
def test_command_line_run_and_multirun_sweep(tmp_path):
    run_dir, sweep_dir = tmp_path / "run", tmp_path / "sweep"
    cli = [sys.executable, "-m", "fedagg.run"]
    base = ["rounds=1", "device=cpu"]
    subprocess.run(cli + base + [f"hydra.run.dir={run_dir}"], cwd=ROOT, check=True, capture_output=True)
    assert json.loads((run_dir / "summary.json").read_text())["choices"]["dataset"] == "digits"
    subprocess.run(cli + ["-m"] + base + ["seed=0,1", f"hydra.sweep.dir={sweep_dir}"], cwd=ROOT, check=True, capture_output=True)
    seeds = sorted(json.loads((sweep_dir / str(i) / "summary.json").read_text())["seed"] for i in (0, 1))
    assert seeds == [0, 1]


@needs_mnist
def test_mnist_from_shared_raw_files_two_classes_per_client(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache"))
    cfg = compose_config("dataset=mnist", f"data.root={SHARED_DATA}", "model=mlr", "partition=n_class",
                         "partition.classes_per_client=2", "rounds=1", "device=cpu", "client.local_epochs=1")
    summary = train(cfg, tmp_path / "run")
    part = json.loads((tmp_path / "run" / "partition.json").read_text())
    assert all(sum(1 for c in client["class_counts"] if c > 0) == 2 for client in part["clients"])
    assert summary["final_test_acc"] > 0.2


def test_wandb_that_cannot_start_warns_and_the_run_goes_on(tmp_path, small_run, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc: no stored key
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # and nothing listening
    with pytest.warns(UserWarning, match="W&B could not start"):
        summary = train(compose_config(*small_run, "logger=wandb", "logger.mode=online"), tmp_path / "run")
    assert summary["status"] == "completed" and (tmp_path / "run" / "metrics.csv").exists()
