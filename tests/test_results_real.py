"""Every fedagg.results function on folders real runs wrote: a sweep of two methods and two seeds through the
basic launcher, and the same jobs stacked (the comparison folder's are in test_compare_report.py)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from real_sweeps import basic_and_stacked, cli_sweep, rows
from fedagg.results import build_table, load_clients, load_curves, load_sweep, load_weights
from fedagg.results.plots import main as plot_main
from fedagg.results.table import main as table_main
from fedagg.results.timing import spent

JOBS = ["client/objective=none,fedprox", "seed=0,1"]
COMMON = ["rounds=4", "num_clients=6", "eval.per_client=true", "eval_every=2"]


def sweep(folder: Path, *extra: str) -> Path:
    return cli_sweep(folder, *COMMON, *JOBS, *extra)


basic, stacked = basic_and_stacked(sweep)


def run_dirs(folder: Path) -> list[Path]:
    return sorted((p.parent for p in folder.rglob("summary.json")), key=lambda p: int(p.name))


@pytest.mark.parametrize("which", ["basic", "stacked"])
def test_the_loaders_read_what_the_runs_wrote(which, request):
    folder = request.getfixturevalue(which)
    dirs = run_dirs(folder)
    summaries = [json.loads((d / "summary.json").read_text()) for d in dirs]
    frame = load_sweep(folder)
    assert list(frame["run"]) == [d.name for d in dirs] and list(frame["status"]) == ["completed"] * 4
    assert list(frame["method"]) == ["fedavg", "fedavg", "fedprox", "fedprox"]  # FedProx is its own method
    assert list(frame["method_name"]) == ["FedAvg", "FedAvg", "FedProx", "FedProx"]
    assert list(frame["final_test_acc"]) == [s["final_test_acc"] for s in summaries]
    assert "damaged" not in frame
    for loader, name in ((load_curves, "metrics.csv"), (load_weights, "weights.csv"), (load_clients, "clients.csv")):
        long = loader(folder)
        files = [rows(d / name) for d in dirs]
        assert len(long) == sum(len(f) for f in files) and len(long) > 4, name
        assert list(long["method"]) == [s["method"] for s, f in zip(summaries, files) for _ in f]
        column = {"metrics.csv": "test_acc", "weights.csv": "weight", "clients.csv": "test_acc"}[name]
        assert long[column].tolist() == pytest.approx([float(r[column]) for f in files for r in f])
    weights = load_weights(folder)
    assert weights["client"].tolist() == [int(r["client"]) for d in dirs for r in rows(d / "weights.csv")]
    assert set(weights["client_choice"]) == {"sgd"}  # the client group beside the clients' ids
    walls = [s["wall_time_s"] for s in summaries]  # the time spent: a stacked group's jobs each report their share
    # one after another, every run's own time, nothing overlaps; stacked, the shares add up to the group's time
    assert spent(summaries) == pytest.approx(sum(walls), abs=2e-3 * len(walls))  # times kept to the millisecond
    if which == "stacked":  # the group's time, once: the shares but the closing of each job as it left
        [group] = json.loads((folder / "stacked_groups.json").read_text())
        assert group["jobs"] == [d.name for d in dirs]
        assert 0.8 * group["wall_time_s"] <= sum(walls) <= group["wall_time_s"] + 2e-3 * len(walls), (walls, group)
        assert spent(summaries[:2]) == pytest.approx(sum(walls[:2]), abs=4e-3)  # one method: its shares


def test_the_table_shows_each_method_by_its_name_with_its_last_k_mean(basic, capsys):
    by_method: dict[str, list[float]] = {}
    for d in run_dirs(basic):
        s = json.loads((d / "summary.json").read_text())
        accs = [float(r["test_acc"]) for r in rows(d / "metrics.csv")]  # rounds 2 and 4
        by_method.setdefault(s["method_name"], []).append(100 * accs[-math.ceil(4 / 10):][0])
    table = build_table(basic, baseline="fedavg")
    grid = table.grids()[0]
    assert list(grid.columns) == ["Method", "digits"]
    for name, values in by_method.items():
        assert [name, f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}"] in grid.values.tolist()
    assert table_main([str(basic), "--baseline", "FedAvg", "--format", "latex"]) == 0  # the id or the name
    latex = capsys.readouterr().out
    assert latex.count(r"\begin{table}") == 1 and "paired difference to FedAvg" in latex
    assert table_main([str(basic), "--rows", "client/objective"]) == 0  # any group, as the command line spells it
    assert "| fedprox | " in capsys.readouterr().out
    assert table_main([str(basic), "--last-k", "0"]) == 2
    assert capsys.readouterr().err == "--last-k 0 is not allowed; it must be an integer >= 1 (evaluated rounds averaged)\n"


def test_a_damaged_metrics_csv_is_named_and_its_run_left_out(basic, tmp_path, capsys):
    import shutil

    folder = tmp_path / "sweep"
    shutil.copytree(basic, folder)
    path = folder / "0" / "metrics.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))  # the last evaluation lost: a last-k mean would quietly change
    table = build_table(folder)
    err = capsys.readouterr().err
    assert err == (f"warning: {path} is damaged: round 4 is missing (summary.json: 4 rounds, every 2 evaluated); "
                   "that run is left out\n")
    cells = table.cells.set_index("method")
    assert cells.loc["fedavg", "n_completed"] == 1 and cells.loc["fedprox", "n_completed"] == 2
    damaged = load_sweep(folder)["damaged"]
    assert damaged[0] == f"{path} is damaged: round 4 is missing (summary.json: 4 rounds, every 2 evaluated)"
    assert damaged[1:].isna().all()
    assert plot_main([str(folder), "--wandb-mode", "disabled"]) == 0
    assert f"warning: {path} is damaged" in capsys.readouterr().err
