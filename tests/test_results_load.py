"""fedagg.results.load_*: a sweep folder into pandas, every run present with its status."""

from __future__ import annotations

import os

import pytest

from fedagg.results import load_clients, load_curves, load_sweep, load_weights
from fedagg.results.runs import ResultsError
from fedagg.results.table import main as table_main
from results_runs import dead_pid, fake_run, unfinished_run


def curves(acc0: float) -> list[dict]:
    return [{"round": r, "test_acc": acc0 + 0.1 * r, "test_loss": 1.0 / r} for r in (1, 2, 3)]


def test_load_sweep_has_a_completed_a_failed_a_diverged_a_running_and_a_killed_job(tmp_path):
    sweep = tmp_path / "sweep"
    fake_run(sweep / "0", acc=0.9, seed=0, metrics=curves(0.5))
    fake_run(sweep / "1", status="failed", acc=None, seed=1, error="ValueError: boom")
    fake_run(sweep / "2", status="diverged", acc=None, seed=2, choices={"aggregator": "fedprox"},
             config={"aggregator": {"mu": 0.1}})
    unfinished_run(sweep / "10", pid=os.getpid(), checkpoint=False, seed=3)  # this process holds it: running
    unfinished_run(sweep / "3", pid=dead_pid(), checkpoint=True, seed=4)  # its process is gone: interrupted
    (sweep / "wandb" / "offline-run-1" / "files").mkdir(parents=True)  # what a plot logged to W&B leaves
    (sweep / "wandb" / "offline-run-1" / "files" / "config.yaml").write_text("_wandb: {}\n")
    frame = load_sweep(sweep)
    assert list(frame["run"]) == ["0", "1", "2", "3", "10"]  # 3 before 10
    assert list(frame["status"]) == ["completed", "failed", "diverged", "interrupted", "running"]
    assert list(frame["seed"]) == [0, 1, 2, 4, 3]
    assert list(frame["aggregator"][:3]) == ["fedavg", "fedavg", "fedprox"] and frame["aggregator"][3:].isna().all()
    assert frame.loc[0, "final_test_acc"] == 0.9 and frame.loc[1, "error"] == "ValueError: boom"
    assert frame.loc[2, "config.aggregator.mu"] == 0.1 and frame.loc[3, "config.aggregator._target_"] == "x.FedAvg"
    assert frame.loc[3, "checkpoint"] == True  # noqa: E712 - a pandas object column
    assert frame.attrs["varying"] == ["aggregator", "seed"]  # the varying overrides (here columns already)


def test_varying_overrides_become_columns_and_the_long_tables_carry_the_runs_columns(tmp_path):
    sweep = tmp_path / "sweep"
    for i, (alpha, seed) in enumerate([(0.1, 0), (0.1, 1), (1.0, 0)]):
        fake_run(sweep / str(i), seed=seed, overrides=[f"partition.alpha={alpha}", f"seed={seed}", "rounds=3"],
                 metrics=curves(0.1 * i), weights=[{"round": 1, "client": c, "weight": 0.5} for c in (0, 1)],
                 clients=[{"round": 3, "client": c, "test_acc": 0.2 * c} for c in range(3)] if i == 2 else None)
    frame = load_sweep(sweep)
    assert list(frame["partition.alpha"]) == ["0.1", "0.1", "1.0"] and "rounds" not in frame  # rounds never varies
    long = load_curves(sweep)
    assert list(long.columns[:8]) == ["run", "status", "seed", "method", "method_name", "dataset", "aggregator",
                                     "partition.alpha"]
    assert len(long) == 9 and list(long["round"]) == [1, 2, 3] * 3
    assert long[long["run"] == "2"]["test_acc"].tolist() == pytest.approx([0.3, 0.4, 0.5])
    assert len(load_weights(sweep)) == 6
    clients = load_clients(sweep)
    assert list(clients["run"]) == ["2"] * 3 and list(clients["partition.alpha"]) == ["1.0"] * 3


def test_a_damaged_summary_is_one_line_naming_the_file(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    fake_run(sweep / "0")
    (sweep / "1").mkdir()
    (sweep / "1" / "summary.json").write_text('{"status": "comp')
    with pytest.raises(ResultsError) as err:
        load_sweep(sweep)
    expected = (f"{sweep / '1' / 'summary.json'} is damaged (JSONDecodeError: Unterminated string starting at: "
                "line 1 column 12 (char 11)); repair or remove that run folder")
    assert str(err.value) == expected
    assert table_main([str(sweep)]) == 2
    assert capsys.readouterr().err == expected + "\n"
