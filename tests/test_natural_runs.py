"""Two-round runs of each federated dataset in both engines, from the command line's composition
(its YAML picks partition=natural) and, for FEMNIST and Shakespeare, small files in LEAF's layout."""

import csv

import pytest

from fake_leaf import write_femnist, write_shakespeare
from fedagg.run import run_experiment


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def _two_rounds(tmp_path, name, overrides):
    """Both engines, two rounds each, scored on every client's own test split; returns their metrics rows."""
    out = {}
    for engine in ("sequential", "parallel"):
        run_dir = tmp_path / f"{name}-{engine}"
        summary = run_experiment([f"dataset={name}", "rounds=2", "eval.per_client=true", f"engine={engine}",
                                  *overrides], run_dir)
        assert summary["status"] == "completed" and summary["choices"]["partition"] == "natural"
        metrics, clients = _rows(run_dir / "metrics.csv"), _rows(run_dir / "clients.csv")
        last = [c for c in clients if c["round"] == "2"]
        # the global test set is the union of the clients' own test splits
        tested = sum(int(c["num_test"]) for c in last)
        assert abs(sum(float(c["test_acc"]) * int(c["num_test"]) for c in last) / tested
                   - float(metrics[-1]["test_acc"])) < 1e-6
        out[engine] = (metrics, len(last))
    (seq, n_seq), (par, n_par) = out["sequential"], out["parallel"]
    assert n_seq == n_par and len(seq) == len(par) == 2
    for a, b in zip(seq, par):  # the same clients, batches and start: the engines agree to float tolerance
        assert abs(float(a["train_loss"]) - float(b["train_loss"])) < 1e-4
    return out


def test_synthetic_runs_all_its_devices_in_both_engines(tmp_path):
    out = _two_rounds(tmp_path, "synthetic", ["model=mlr", "dataset.num_devices=12", "num_clients=null",
                                              "clients_per_round=4"])
    assert out["sequential"][1] == 12  # num_clients=null: every device


@pytest.mark.slow
def test_femnist_and_shakespeare_run_from_leaf_files_in_both_engines(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache"))
    write_femnist(tmp_path / "data", sizes=((12, 20, 9), (15,)))
    write_shakespeare(tmp_path / "data", sizes=(10, 16, 7))
    root = f"data.root={tmp_path / 'data'}"
    assert _two_rounds(tmp_path, "femnist", ["model=cnn_femnist", root, "num_clients=3"])["parallel"][1] == 3
    assert _two_rounds(tmp_path, "shakespeare", ["model=lstm_shakespeare", root, "num_clients=null",
                                                 "model.hidden=32", "client.batch_size=4"])["parallel"][1] == 3
