"""python -m fedagg.compare end to end on the bundled digits: a bad method is one line before anything runs;
a comparison killed (SIGKILL) in the middle of a trial and run again ends as one run straight through."""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT

SMALL = ["methods=[fedavg,fedprox]", "budget=2", "confirm_seeds=1", "rounds=10", "checkpoint_every=1", "device=cpu"]


def compare(*args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "fedagg.compare", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), **kwargs)


@pytest.mark.slow  # a subprocess (3-12 s); the refusals themselves are unit-tested in test_compare.py
def test_an_unknown_method_is_one_line_and_nothing_runs(tmp_path):
    proc = compare("methods=[fedavg,fedbogus]", f"hydra.sweep.dir={tmp_path}")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in out
    assert re.sub(r"^\[[^]]*\]\[[^]]*\]\s*(- )?", "", lines[0]).startswith(  # after the logger's time and name
        "methods: 'fedbogus' is not an aggregator or a client objective; choose from abavg, acc_inverse,")
    assert not (tmp_path / "tune").exists() and not (tmp_path / "tuning.db").exists()


def selection(folder):
    with open(folder / "selection.csv", newline="") as f:
        return list(csv.DictReader(f))


def confirm_results(folder):
    return {p.parent.relative_to(folder).as_posix(): json.loads(p.read_text())["final_test_acc"]
            for p in sorted((folder / "confirm").rglob("summary.json"))}


@pytest.mark.slow
def test_a_comparison_killed_mid_trial_and_run_again_equals_one_run_straight_through(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    proc = compare(*SMALL, f"hydra.sweep.dir={straight}")
    assert proc.wait(timeout=600) == 0, proc.stdout.read()[-3000:]

    victim = killed / "tune" / "fedprox" / "t000" / "s0"  # the second trial to run
    proc = compare(*SMALL, f"hydra.sweep.dir={killed}", start_new_session=True)
    deadline = time.time() + 300
    while not (victim / "checkpoint.pt").exists():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    summary = victim / "summary.json"
    assert not summary.exists() or json.loads(summary.read_text())["status"] == "running"  # killed mid-trial
    proc = compare(*SMALL, f"hydra.sweep.dir={killed}")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert "resuming after round" in out  # the killed trial went on from its checkpoint

    a, b = selection(straight), selection(killed)
    assert [(r["method"], r["trial"], r["params"], r["chosen"]) for r in a] == \
           [(r["method"], r["trial"], r["params"], r["chosen"]) for r in b]
    assert [r["method"] for r in a] == ["fedavg", "fedavg", "fedprox", "fedprox"]  # exactly the budget each
    for x, y in zip(a, b):
        assert float(x["val_score"]) == pytest.approx(float(y["val_score"]), abs=1e-6)
    ra, rb = confirm_results(straight), confirm_results(killed)
    assert list(ra) == ["confirm/default/fedavg/s1", "confirm/default/fedprox/s1",
                        "confirm/tuned/fedavg/s1", "confirm/tuned/fedprox/s1"]  # seed 1: not the tuning seed 0
    assert list(rb) == list(ra) and all(rb[k] == pytest.approx(ra[k], abs=1e-6) for k in ra)
    for trial in (killed / "tune").rglob("metrics.csv"):  # tuning never scored the test set
        rows = list(csv.DictReader(open(trial)))
        assert rows and all(r["test_acc"] == "" and r["val_acc"] != "" for r in rows)
    assert (killed / "report.html").exists()
