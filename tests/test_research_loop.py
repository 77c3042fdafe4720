"""The research loop as README's "From your rule to the paper" writes it, run from a folder outside the package:
the rule's two files, the comparison with it, FedProx and FedAdam, then the LaTeX table and the figure from
the comparison's folder. The commands are the README's, with fewer rounds, trials and seeds."""

from __future__ import annotations

import csv
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SHARED_DATA, needs_mnist

pytest.importorskip("optuna")

README = (ROOT / "docs" / "tutorials" / "fair-comparison.md").read_text()  # the tutorial page that holds the loop
SMALLER = {"data.root": str(SHARED_DATA), "rounds": "20", "budget": "1", "tune_seeds": "[0]", "confirm_seeds": "2",
           "num_clients": "10"}
EXTRA = ["experiment_scale=0.1"]  # 2 rounds on a tenth of the data: the loop, not the accuracy
NAMES = {"fedavg": "FedAvg", "fedprox": "FedProx", "fedadam": "FedAdam", "median_norm": "Median-norm"}


def block(first_line: str) -> str:
    match = re.search(r"```\w*\n(" + re.escape(first_line) + r"\n.*?)```", README, re.S)
    assert match, f"README has no block starting with {first_line!r}"
    return match.group(1)


def commands() -> list[list[str]]:
    """The loop's commands: the block after the rule's YAML, continuation lines joined, comments dropped."""
    text = README.split("# my_conf/aggregator/median_norm.yaml", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = text.replace("\\\n", " ").splitlines()
    return [shlex.split(line.split("  #", 1)[0]) for line in lines if line.strip()]


def smaller(argv: list[str]) -> list[str]:
    out = []
    for arg in argv:
        key = arg.split("=", 1)[0]
        out.append(f"{key}={SMALLER[key]}" if "=" in arg and key in SMALLER else arg)
    return out + (EXTRA if "fedagg.compare" in argv else [])


@pytest.fixture(scope="module")
def loop(tmp_path_factory) -> tuple[Path, list[subprocess.CompletedProcess]]:
    folder = tmp_path_factory.mktemp("researcher")
    for name in ("my_rules/median_norm.py", "my_conf/aggregator/median_norm.yaml"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(block(f"# {name}"))
    done = []
    for argv in commands():
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([".", str(ROOT)]),
                   FEDAGG_DATA=str(SHARED_DATA))  # the page downloads MNIST into ./data; the suite has a copy
        assert argv[:2] in (["PYTHONPATH=.", "python"], ["python", "-m"]), argv
        argv = [a for a in argv if a != "PYTHONPATH=."]
        proc = subprocess.run([sys.executable, *smaller(argv)[1:]], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, (argv, proc.stderr[-3000:])
        done.append(proc)
    return folder / "outputs" / "compare" / "mine", done


def last_k(run_dir: Path, rounds: int) -> float:
    with open(run_dir / "metrics.csv", newline="") as f:
        accs = [float(r["test_acc"]) for r in csv.DictReader(f) if r["test_acc"]]
    k = math.ceil(rounds / 10)
    return 100 * sum(accs[-k:]) / k


@needs_mnist
def test_the_loop_gives_the_papers_table_with_every_method_by_its_name(loop):
    folder, (compare, table, _) = loop
    assert [c[1:3] for c in commands()] == [["python", "-m"], ["-m", "fedagg.results"], ["-m", "fedagg.results"]]
    latex = table.stdout
    assert latex == (folder / "table.tex").read_text()  # the comparison wrote what the results layer prints
    assert latex.startswith(r"% Needs \usepackage{booktabs}") and latex.count(r"\begin{table}") == 1
    assert r"\caption{" in latex and r"\label{tab:mine}" in latex
    rows = {line.split(" & ")[0]: line for line in latex.splitlines() if " & " in line and r"\\" in line}
    for method, name in NAMES.items():
        tuned = [last_k(folder / "confirm" / "tuned" / method / f"s{s}", 2) for s in (1, 2)]
        default = [last_k(folder / "confirm" / "default" / method / f"s{s}", 2) for s in (1, 2)]
        for values in (tuned, default):
            assert f"{statistics.fmean(values):.2f} $\\pm$ {statistics.stdev(values):.2f}" in rows[name]
    assert rows["FedAvg"].count("---") == 2  # the baseline: no difference to itself
    best = max(NAMES.values(), key=lambda n: float(rows[n].split(" & ")[1].strip(r"\textbf{").split(" ")[0]))
    assert rows[best].split(" & ")[1].startswith(r"\textbf{")  # the best tuned mean is bold
    assert "Median-norm" in (folder / "report.html").read_text()


@needs_mnist
def test_the_loop_gives_the_figure_with_every_method_on_one_axis(loop):
    folder, (_, _, plot) = loop
    shown = plot.stdout.splitlines()
    assert "outputs/compare/mine/methods.pdf" in shown and "outputs/compare/mine/methods.png" in shown
    assert (folder / "methods.pdf").read_bytes().startswith(b"%PDF") and (folder / "methods.png").stat().st_size > 10000
    from fedagg.results.figure import comparison_lines, curve_against

    lines = comparison_lines(folder)
    assert list(lines) == list(NAMES.values())  # one line per method, by its name, in the comparison's order
    for name, runs in lines.items():
        method = next(m for m, n in NAMES.items() if n == name)
        assert sorted(str(r["dir"].relative_to(folder)) for r in runs) == [f"confirm/tuned/{method}/s1",
                                                                            f"confirm/tuned/{method}/s2"]
        xs, mean, _ = curve_against(runs, "round")
        assert xs == [1.0, 2.0] and mean[-1] == pytest.approx(statistics.fmean(
            last_k(folder / "confirm" / "tuned" / method / f"s{s}", 2) for s in (1, 2)))
