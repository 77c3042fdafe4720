"""A comparison's outputs, on a folder a real `python -m fedagg.compare` wrote: report.html, table.tex and the
methods figure agree with the runs' own files; a diverged baseline still gets a report; fragile choices are
flagged; the time spent counts runs that ran at once once."""

from __future__ import annotations

import csv
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from fedagg import run_experiment
from fedagg.compare.report import fragile, seed_noise
from fedagg.results.timing import spent

pytest.importorskip("optuna")

SEEDS = (1, 2)


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("compare")
    proc = run("-m", "fedagg.compare", "methods=[fedavg,fedprox]", "budget=1", "confirm_seeds=2", "rounds=3",
               "num_clients=6", "hydra.sweep.dir=c", cwd=where)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return where / "c"


def last_k(run_dir: Path) -> float:
    """The confirm metric from the run's own metrics.csv: the mean of its last ceil(R/10) test accuracies."""
    with open(run_dir / "metrics.csv", newline="") as f:
        accs = [float(r["test_acc"]) for r in csv.DictReader(f) if r["test_acc"]]
    k = math.ceil(3 / 10)
    return sum(accs[-k:]) / k


def test_the_report_and_table_tex_show_the_runs_own_values(compared):
    values = {(m, kind): [last_k(compared / "confirm" / kind / m / f"s{s}") for s in SEEDS]
              for m in ("fedavg", "fedprox") for kind in ("tuned", "default")}
    tex = (compared / "table.tex").read_text()
    assert tex.startswith(r"% Needs \usepackage{booktabs}") and tex.count(r"\begin{table}") == 1
    for m, name in (("fedavg", "FedAvg"), ("fedprox", "FedProx")):
        row = next(line for line in tex.splitlines() if line.startswith(name + " &"))
        for kind in ("tuned", "default"):
            v = [100 * x for x in values[(m, kind)]]
            assert f"{statistics.fmean(v):.2f} $\\pm$ {statistics.stdev(v):.2f}" in row
    assert r"\multicolumn{2}{c}{Tuned} & \multicolumn{2}{c}{Defaults}" in tex
    page = (compared / "report.html").read_text()
    for (m, kind), v in values.items():  # every confirm run, by seed
        shown = "defaults" if kind == "default" else "tuned"
        name = {"fedavg": "FedAvg", "fedprox": "FedProx"}[m]
        cells = "".join(f"<td>{100 * x:.2f}</td>" for x in v)
        assert f"<tr><td>{name}</td><td>{shown}</td>{cells}<td></td></tr>" in page
    assert "<h2>Test accuracy of the tuned methods</h2>" in page and "<h2>Time spent</h2>" in page
    assert (compared / "methods.pdf").stat().st_size > 5000 and (compared / "methods.png").stat().st_size > 5000
    # the results layer tables the same folder with the same numbers, and leaves the comparison's report alone
    before = page
    proc = run("-m", "fedagg.results", "table", str(compared), "--format", "latex", cwd=compared)
    assert proc.returncode == 0 and proc.stdout.split("% Metric")[0] == tex.split("% Metric")[0]
    proc = run("-m", "fedagg.results", "report", str(compared), "--wandb-mode", "disabled", cwd=compared)
    assert proc.returncode == 0, proc.stderr
    assert (compared / "report.html").read_text() == before and (compared / "results_report.html").exists()


def test_a_comparison_whose_baseline_diverged_still_gets_its_report(compared, tmp_path):
    from fedagg.compare.protocol import make_protocol
    from fedagg.compare.report import write_report

    folder = tmp_path / "c"
    shutil.copytree(compared, folder)
    for kind in ("tuned", "default"):  # the baseline's confirm runs, run again where they diverge in round 1
        for s in SEEDS:
            summary = run_experiment(["rounds=3", "num_clients=6", "client.lr=1e8", f"seed={s}", "overwrite=true"],
                                     folder / "confirm" / kind / "fedavg" / f"s{s}")
            assert summary["status"] == "diverged"
    protocol = make_protocol(["fedavg", "fedprox"], 1, [0], len(SEEDS), None, 0.1, 1, 0)
    write_report(folder, protocol, {"fedavg": [], "fedprox": []}, {})
    page = (folder / "report.html").read_text()
    assert "<tr><td>FedAvg</td><td>tuned</td><td>diverged</td><td>diverged</td>" in page
    assert "FedAvg (tuned): seed 1 diverged; seed 2 diverged" in page  # flagged at the top
    tex = (folder / "table.tex").read_text()
    row = next(line for line in tex.splitlines() if line.startswith("FedAvg &"))
    assert row == r"FedAvg & $\times$ & --- & $\times$ & --- \\"
    fedprox = next(line for line in tex.splitlines() if line.startswith("FedProx &"))
    assert r"\textbf{" in fedprox and fedprox.count("---") == 2  # no pairs with a diverged baseline


def test_a_seed_far_below_the_others_is_flagged_and_noise_is_not():
    ok = {1: ("completed", 0.894), 2: ("completed", 0.891), 3: ("completed", 0.886)}
    bad = {1: ("completed", 0.894), 2: ("completed", 0.696), 3: ("completed", 0.892)}
    diverged = {1: ("completed", 0.9), 2: ("diverged", None), 3: ("completed", 0.9)}
    values = {("a", "tuned"): ok, ("b", "tuned"): bad, ("a", "defaults"): ok, ("b", "defaults"): ok}
    noise = seed_noise(values)  # the median of the configurations' sds: the fragile one does not widen it
    assert noise == pytest.approx(statistics.stdev([0.894, 0.891, 0.886]))
    assert fragile(ok, noise) == []
    assert fragile(bad, noise) == ["seed 2: 69.60, the others 89.40, 89.20"]
    assert fragile(diverged, noise) == ["seed 2 diverged"]
    # one point is the least that counts: seeds that agree to a few hundredths are not flagged
    assert fragile({1: ("completed", 0.900), 2: ("completed", 0.893), 3: ("completed", 0.900)}, 0.0) == []


def test_time_spent_counts_overlapping_runs_once():
    runs = [{"wall_time_s": 10.0, "finished_at": 110.0}, {"wall_time_s": 10.0, "finished_at": 110.0},  # a group
            {"wall_time_s": 5.0, "finished_at": 108.0}, {"wall_time_s": 4.0, "finished_at": 200.0}]
    assert spent(runs) == pytest.approx(10.0 + 4.0)  # [100, 110] once, [196, 200]
    assert spent([]) == 0.0
