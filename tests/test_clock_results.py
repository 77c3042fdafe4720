"""The results layer on folders of real runs on the simulated clock: tiny MNIST sweeps with clock=lognormal, run
alone (the basic launcher) and stacked (the in-step driver): time to target in tables, accuracy against
simulated time and client updates in plots and reports."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from conftest import SHARED_DATA, needs_mnist
from real_sweeps import basic_and_stacked, cli_sweep, rows
from fedagg.results import plots as plot
from fedagg.results.table import main as table_main

pytestmark = needs_mnist

COMMON = ["dataset=mnist", f"data.root={SHARED_DATA}", "model=mlr", "rounds=100", "experiment_scale=0.04",
          "num_clients=6", "clients_per_round=3", "client.local_epochs=1", "target_acc=0.6", "clock=lognormal",
          "clock.deadline=50.0", "clock.over_select=0.3"]  # ⌈1.3 · 3⌉ = 4 sampled
JOBS = ["client/objective=none,fedprox", "seed=0,1"]


def sweep(folder: Path, *extra: str) -> Path:
    return cli_sweep(folder, *COMMON, *JOBS, *extra, env={"FEDAGG_CACHE": str(folder / "cache")})


basic, stacked = basic_and_stacked(sweep)


def runs_of(folder: Path) -> dict[tuple, Path]:
    out = {}
    for summary in folder.rglob("summary.json"):
        s = json.loads(summary.read_text())
        out[(s["method_name"], s["seed"])] = summary.parent  # as tables and plots name the method
    return out


def test_runs_record_time_to_target_as_the_sim_time_of_the_round_reaching_it(basic):
    runs = runs_of(basic)
    assert len(runs) == 4
    reached = 0
    for run in runs.values():
        s, metrics = json.loads((run / "summary.json").read_text()), rows(run / "metrics.csv")
        assert s["final_sim_time"] == pytest.approx(float(metrics[-1]["sim_time"]))
        first = next((r for r in metrics if float(r["test_acc"]) >= 0.6), None)
        if first is None:
            assert s["time_to_target"] is None and s["rounds_to_target"] is None
            continue
        reached += 1
        assert s["rounds_to_target"] == int(first["round"])
        assert s["time_to_target"] == pytest.approx(float(first["sim_time"]))
    assert reached >= 2  # the table below has values to average


def test_stacked_runs_keep_the_same_clock(basic, stacked):
    # the in-step driver begins the same rounds: the same clients arrive at the same simulated times
    alone, together = runs_of(basic), runs_of(stacked)
    assert alone.keys() == together.keys()
    for key in alone:
        columns = lambda run: [(r["round"], r["sim_time"], r["client_updates"], r["clients_late"])  # noqa: E731
                               for r in rows(run / "metrics.csv")]
        assert columns(alone[key]) == columns(together[key])


def test_table_of_time_to_target(basic):
    assert table_main([str(basic), "--rows", "method", "--columns", "seed", "--metric", "time_to_target"]) == 0
    text = (basic / "table.md").read_text()
    assert "Simulated seconds (the clock's sim_time) to reach the target accuracy (0.6)" in text
    cells = {(row["method"], int(row["seed"])): row for row in rows(basic / "table.csv")}
    runs = runs_of(basic)
    assert len(cells) == len(runs) == 4
    for (method, seed), run in runs.items():  # a cell per run: its own time_to_target, or N/A with its best accuracy
        s = json.loads((run / "summary.json").read_text())
        cell = cells[(method.lower(), seed)]
        if s["time_to_target"] is None:
            assert cell["measured_text"] == f"N/A ({100 * s['best_test_acc']:.2f}%)"
        else:
            assert float(cell["mean"]) == pytest.approx(s["time_to_target"])
    assert len({float(c["mean"]) for c in cells.values() if c["mean"]}) > 1  # the seeds' clients differ in time


def test_plot_draws_accuracy_against_sim_time_and_client_updates(basic, monkeypatch):
    figures = []
    monkeypatch.setattr(plot.plt, "close", figures.append)
    assert plot.main([str(basic), "--wandb-mode", "disabled"]) == 0
    assert (basic / "accuracy_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    drawn = [f for f in figures if f.axes and f.axes[0].get_xlabel() == "simulated time (s)"]
    assert len(drawn) == 1
    by_time, by_updates = drawn[0].axes
    assert by_updates.get_xlabel() == "client updates aggregated" and by_time.get_xscale() == "linear"
    runs = runs_of(basic)
    for line in by_time.lines:
        method = line.get_label()
        seeds = [rows(run / "metrics.csv") for (m, _), run in runs.items() if m == method]
        # x: the mean over the two seeds of sim_time at each evaluated round; y: the mean accuracy in %
        expected_x = [statistics.fmean(float(s[i]["sim_time"]) for s in seeds) for i in range(len(seeds[0]))]
        expected_y = [statistics.fmean(100 * float(s[i]["test_acc"]) for s in seeds) for i in range(len(seeds[0]))]
        torch.testing.assert_close(list(map(float, line.get_xdata())), expected_x)
        torch.testing.assert_close(list(map(float, line.get_ydata())), expected_y)
    for line in by_updates.lines:
        seeds = [rows(run / "metrics.csv") for (m, _), run in runs.items() if m == line.get_label()]
        expected = [statistics.fmean(float(s[i]["client_updates"]) for s in seeds) for i in range(len(seeds[0]))]
        torch.testing.assert_close(list(map(float, line.get_xdata())), expected)
    assert {line.get_label() for line in by_time.lines} == {m for m, _ in runs}


def test_report_shows_accuracy_against_simulated_time(basic):
    from fedagg.results.report import main as report_main

    assert report_main([str(basic), "--wandb-mode", "disabled"]) == 0
    page = (basic / "report.html").read_text()
    assert "Test accuracy against simulated time" in page and "Test accuracy against bits sent" in page
