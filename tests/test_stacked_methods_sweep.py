"""hydra/launcher=stacked through the command line: every stateful rule, and MOON resumed after a SIGKILL, give each
job the files it gets run alone (the basic launcher, engine=parallel), file by file.

The rules are found in conf/aggregator/: every synchronous one that keeps state between rounds (its own
`state_dict`), has a client half or keeps a sensitivity, so a new one is checked too (FedBN, which needs a model
with normalisation layers, is checked on the engine in test_stacked_methods.py). The MOON sweep checkpoints some
jobs every round and the others every third, so that a SIGKILL in round 2 or 3 leaves them at different rounds:
the relaunched sweep trains rounds of different numbers side by side and groups other jobs in its later rounds
than the uninterrupted sweep did.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from conftest import CONF, ROOT
from tests.test_stacked_sweep import assert_same_job


def _stateful_rules() -> list[str]:
    from fedagg.aggregators.base import Aggregator

    names = []
    for path in sorted((CONF / "aggregator").glob("*.yaml")):
        node = OmegaConf.create({"attack": {"fraction": 0.0}, "node": OmegaConf.load(path)}).node
        rule = instantiate(node)
        needs = rule.needs
        if rule.asynchronous or (needs.client_half is not None and needs.client_half.personal):
            continue  # the asynchronous server never stacks; FedBN: on the engine (see above)
        if type(rule).state_dict is not Aggregator.state_dict or needs.client_half or needs.sensitivity:
            names.append(path.stem)
    return names


def _sweep(folder: Path, *args: str, launcher: str | None = "stacked", wait: bool = True):
    cmd = [sys.executable, "-m", "fedagg.run", "-m", "engine=parallel", "device=cpu", *args,
           f"hydra.sweep.dir={folder}"]
    if launcher:
        cmd.append(f"hydra/launcher={launcher}")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.mark.slow
def test_every_stateful_rule_stacked_equals_its_job_run_alone(tmp_path):
    rules = _stateful_rules()
    assert {"scaffold", "feddyn", "elastic", "ewwa", "fedadam", "fednova"} <= set(rules), rules
    args = [f"aggregator={','.join(rules)}", "rounds=3", "clients_per_round=5", "client.momentum=0.5"]
    _sweep(tmp_path / "alone", *args, launcher=None)
    out = _sweep(tmp_path / "stacked", *args)
    assert f"{len(rules)} completed" in out
    assert "jobs " + ", ".join(f"#{j}" for j in range(len(rules))) + " train together" in out
    for j in range(len(rules)):
        assert_same_job(tmp_path / "stacked" / str(j), tmp_path / "alone" / str(j))


MOON = ["client/objective=moon", "seed=0,1", "checkpoint_every=1,3", "rounds=6", "resume=true"]


@pytest.mark.slow
def test_a_stacked_moon_sweep_killed_midway_resumes_to_the_files_of_its_jobs_alone(tmp_path):
    alone, stacked = tmp_path / "alone", tmp_path / "stacked"
    _sweep(alone, *MOON, launcher=None)
    proc = _sweep(stacked, *MOON, wait=False)
    # jobs 0 and 2 checkpoint every round, 1 and 3 every third: killed after round 2, before round 3 ends
    metrics = stacked / "0" / "metrics.csv"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:  # the header and two rounds
            break
        time.sleep(0.02)
    assert proc.poll() is None, proc.stdout.read()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    out = _sweep(stacked, *MOON)  # the same command
    assert "4 completed" in out and "jobs #0, #1, #2, #3 train together" in out
    assert out.count("has no checkpoint yet: starting from round 1") == 2, out  # jobs 1 and 3
    assert out.count("resuming after round") == 2, out  # jobs 0 and 2, a round or two ahead
    for j in range(4):
        assert_same_job(stacked / str(j), alone / str(j))
