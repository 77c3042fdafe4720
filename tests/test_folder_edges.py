"""A run folder is the run's alone: never a sweep's top, a fresh log when replaced, untouched when refused."""

import hashlib
import json
import logging
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, compose_config
from fedagg import run_experiment
from fedagg.run import FolderHeld, train


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "fedagg.run", *args], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def messages(text):
    return [re.sub(r"^\[[^]]*\]\[[^]]*\]\[[A-Z]+\] - ", "", line) for line in text.strip().splitlines()]


@pytest.mark.parametrize("extra", [[], ["overwrite=true"], ["resume=true"]])
def test_a_single_run_into_a_folder_holding_a_sweep_is_refused(tmp_path, extra):
    sweep = tmp_path / "sweep"
    for seed in (0, 1):
        train(compose_config("rounds=1", "device=cpu", f"seed={seed}"), sweep / str(seed))
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    before = snapshot(sweep)
    with pytest.raises(FolderHeld) as err:
        run_experiment(["rounds=1", "device=cpu", *extra], sweep)
    assert str(err.value) == (f"{sweep} holds a sweep: 2 runs in its subfolders, e.g. 0; a run written there would "
                              "hide them from tables and reports, and nothing there was changed: use another "
                              "hydra.run.dir")
    assert snapshot(sweep) == before


def test_overwrite_starts_a_fresh_log_and_a_refused_resume_leaves_the_log_as_it_was(tmp_path):
    folder = tmp_path / "run"
    first = run_cli("rounds=1", "device=cpu", f"hydra.run.dir={folder}")
    assert first.returncode == 0, first.stderr[-2000:]
    log = (folder / "run.log").read_bytes()
    assert re.fullmatch(rf"completed: final test accuracy [\d.]+ after 1 rounds \({re.escape(str(folder))}\)",
                        messages(log.decode())[-1])
    refused = run_cli("rounds=2", "device=cpu", "resume=true", f"hydra.run.dir={folder}")
    assert refused.returncode == 2 and "nothing there was changed" in refused.stdout
    assert (folder / "run.log").read_bytes() == log  # the refusal is on the console only
    replaced = run_cli("rounds=1", "device=cpu", "seed=3", "overwrite=true", f"hydra.run.dir={folder}")
    assert replaced.returncode == 0, replaced.stderr[-2000:]
    lines = messages((folder / "run.log").read_text())
    assert lines[0] == f"overwrite=true: removed a completed run (seed=0, 1 round) from {folder}"
    assert [line for line in lines if line.startswith("completed")] == [lines[-1]]  # the new run's alone
    assert json.loads((folder / "summary.json").read_text())["seed"] == 3


def test_the_start_up_line_gives_the_scaled_training_count_beside_the_scaled_test_count(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    run_experiment(["rounds=1", "device=cpu", "experiment_scale=0.1"], tmp_path / "run")
    total = json.loads((tmp_path / "run" / "partition.json").read_text())["total"]
    assert 144 <= total < 170  # each of the 10 clients keeps ⌈0.1 n_k⌉ of its samples
    said = [m for m in caplog.messages if m.startswith("digits: ")]
    assert len(said) == 1 and said[0].startswith(f"digits: {total} train / 36 test samples, 10 clients")
