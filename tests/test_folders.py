"""Typed configuration, one run per folder, damaged checkpoints, honest sweeps: one clear line each, and an
existing run folder left exactly as it was."""

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT, compose_config
from fedagg.run import SetupError, train

TESTS = str(ROOT / "tests")


def snapshot(folder):
    """Every file below the folder with a hash of its content."""
    return {p.relative_to(folder).as_posix(): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    folder = tmp_path_factory.mktemp("finished")
    train(compose_config("rounds=2", "device=cpu"), folder)
    return folder


BAD = [  # (overrides, the one line that must come back)
    ("client.lr=abc", "client.lr='abc' is not allowed; it must be a number"),
    ("client.lr=[1,2]", "client.lr=[1, 2] is not allowed; it must be a number"),
    ("client.momentum=abc", "client.momentum='abc' is not allowed; it must be a number"),
    ("client.decay=abc", "client.decay='abc' is not allowed; it must be a number"),
    ("client.weight_decay=[0.1]", "client.weight_decay=[0.1] is not allowed; it must be a number"),
    ("target_acc=abc", "target_acc='abc' is not allowed; it must be a number or null"),
    ("data.root=null", "data.root=null is not allowed; it must be a string"),
    ("+client.lrr=0.1", "client.lrr is not a setting fedagg knows (did you mean client.lr?); remove it or correct its name"),
    ("rounds=true", "rounds=true is not allowed; it must be an integer"),
    ("client.local_epochs=true", "client.local_epochs=true is not allowed; it must be an integer"),
    ("deterministic=maybe", "deterministic='maybe' is not allowed; it must be true or false"),
    ("client.keep_optimizer_state=maybe", "client.keep_optimizer_state='maybe' is not allowed; it must be true or false"),
    ("engine=parallel engine.compile=maybe", "engine.compile='maybe' is not allowed; it must be true or false"),
    ("+lr=0.5", "lr is not a setting fedagg knows (did you mean client.lr?); remove it or correct its name"),
    ("+data.rot=x", "data.rot is not a setting fedagg knows (did you mean data.root?); remove it or correct its name"),
    ("client.lr=inf", "client.lr=inf is not allowed; it must be a finite number"),
    ("aggregator=fedawa aggregator.server_lr=nan", "aggregator.server_lr=nan is not allowed; it must be a finite number"),
    ("aggregator=feddyn aggregator.client.alpha=abc", "aggregator.client.alpha='abc' is not allowed; it must be a number"),
    ("aggregator=krum aggregator.f=2.5", "aggregator.f=2.5 is not allowed; it must be an integer or null"),
    ("+aggregator.betta=0.5", "aggregator.betta is not a setting fedagg knows"),
]


@pytest.mark.parametrize("overrides, message", BAD, ids=[b for b, _ in BAD])
def test_bad_values_are_one_line_and_leave_an_existing_folder_alone(finished, overrides, message):
    before = snapshot(finished)
    with pytest.raises(ValueError) as info:
        train(compose_config("rounds=2", "device=cpu", *overrides.split()), finished)
    assert type(info.value).__name__ == "SetupError" and str(info.value).startswith(message)
    assert "\n" not in str(info.value)
    assert snapshot(finished) == before


def test_a_completed_run_resumed_with_another_config_is_refused_and_unchanged(finished):
    before = snapshot(finished)
    with pytest.raises(ValueError, match=r"resume=true but .* holds a completed run whose configuration differs in "
                                         r"client.lr; nothing there was changed"):
        train(compose_config("rounds=2", "device=cpu", "client.lr=0.2", "resume=true"), finished)
    again = train(compose_config("rounds=2", "device=cpu", "resume=true"), finished)  # the same: skipped
    assert again["status"] == "completed" and snapshot(finished) == before


HOLD = """
import sys, time
from fedagg.runtime.folder import RunFolder
RunFolder(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_run_in_a_folder_is_refused_and_a_dead_owner_taken_over(tmp_path, caplog):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=rf"^{tmp_path} is in use by another run \(process {holder.pid}\); wait"):
            train(compose_config("rounds=1", "device=cpu"), tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == [".owner"]  # nothing of the refused run
    finally:
        holder.kill()
        holder.wait()
    # the holder was killed: its .owner remains, the kernel dropped the lock
    with caplog.at_level(logging.INFO):
        summary = train(compose_config("rounds=1", "device=cpu"), tmp_path)
    assert summary["status"] == "completed" and f"from process {holder.pid}, which has gone" in caplog.text
    assert not (tmp_path / ".owner").exists()


def test_a_read_only_folder_is_named(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(ValueError, match=rf"^cannot write to the run folder {folder} \(it is read-only\)"):
            train(compose_config("rounds=1", "device=cpu"), folder)
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


def test_a_damaged_checkpoint_is_named_and_the_previous_one_used(tmp_path, caplog):
    overrides = ["rounds=4", "device=cpu", "checkpoint_every=2"]
    reference = train(compose_config(*overrides), tmp_path / "reference")
    run = tmp_path / "run"
    train(compose_config(*overrides), run)
    assert torch.load(run / "checkpoint.prev.pt", weights_only=False)["round"] == 2
    (run / "summary.json").unlink()  # as if killed after its last checkpoint
    (run / "checkpoint.pt").write_bytes((run / "checkpoint.pt").read_bytes()[:1000])  # cut short
    with caplog.at_level(logging.WARNING):
        summary = train(compose_config(*overrides, "resume=true"), run)
    assert f"{run / 'checkpoint.pt'} is damaged" in caplog.text and "resuming from checkpoint.prev.pt (after round 2)" in caplog.text
    assert summary["final_test_acc"] == reference["final_test_acc"]
    (run / "summary.json").unlink()
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        (run / name).write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=rf"^{run / 'checkpoint.pt'} is damaged \(.*\) and there is no earlier checkpoint"):
        train(compose_config(*overrides, "resume=true"), run)


def test_resume_on_an_empty_folder_says_it_starts_fresh(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        train(compose_config("rounds=1", "device=cpu", "resume=true"), tmp_path)
    assert f"resume=true but {tmp_path} has no checkpoint yet: starting from round 1" in caplog.text


@pytest.mark.slow  # a CLI subprocess of 10-30 s; the default suite must stay under 10 minutes
def test_a_backbone_for_large_images_warns_once(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        train(compose_config("rounds=1", "device=cpu", "model=resnet18", "num_clients=2", "client.local_epochs=1",
                             "experiment_scale=0.1"), tmp_path)
    assert caplog.text.count("ResNet18 takes 224x224 inputs: digits's 8x8 images are upsampled 28x") == 1


def run_cli(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "fedagg.run", *args], cwd=cwd, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), TESTS]), **(env or {})))


def test_an_empty_run_dir_is_refused(tmp_path):
    proc = run_cli("rounds=1", "hydra.run.dir=", cwd=tmp_path)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "hydra.run.dir='' is not allowed" in lines[0]
    assert list(tmp_path.iterdir()) == []  # no result file, and no log: the run never had a folder


@pytest.mark.slow  # a CLI sweep or several subprocess runs: ~8-10 s on 2 idle cores
def test_a_sweep_with_a_failed_job_says_so_and_exits_nonzero(tmp_path):
    targets = "fedagg.aggregators.base.FedAvg,test_resilience.Boom"
    proc = run_cli("-m", "rounds=1", "device=cpu", f"hydra.sweep.dir={tmp_path}", f"aggregator._target_={targets}",
                   cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out
    assert f"sweep {tmp_path}: 1 completed, 1 failed" in out and f"failed: {tmp_path / '1'}: RuntimeError: boom" in out
    assert json.loads((tmp_path / "0" / "summary.json").read_text())["status"] == "completed"


@pytest.mark.slow  # a CLI subprocess of 10-30 s; the default suite must stay under 10 minutes
def test_a_clean_stop_prints_one_line_not_a_traceback(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "fedagg.run", "rounds=40", "device=cpu", "client.local_epochs=4",
                             "checkpoint_every=1", f"hydra.run.dir={tmp_path}"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        end = time.time() + 120
        while not (tmp_path / "checkpoint.pt").exists():
            assert proc.poll() is None and time.time() < end
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()  # a run that outlives its test would hold CI's output open
    assert proc.returncode == 130 and "Traceback" not in out
    assert "resume=true with the same settings continues from its checkpoint" in out
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "interrupted"


def messages(out):
    """The lines of a CLI run's output without Hydra's time and logger prefix."""
    return [re.sub(r"^\[[^]]*\]\[[^]]*\](\[[A-Z]+\] -)? ?", "", line) for line in out.strip().splitlines()]


def assert_unchanged(folder, before):
    """Every file as it was, the run's log too: a refused or skipped launch writes its lines to the console only."""
    assert snapshot(folder) == before


def holds(folder, what):
    return (f"{folder} holds {what}; nothing was changed: continue it with resume=true, keep it with another "
            "hydra.run.dir or hydra.sweep.dir, or replace it with overwrite=true")


def test_a_run_into_a_folder_holding_a_run_is_refused_until_overwrite_replaces_it(tmp_path, caplog):
    folder = tmp_path / "run"
    # checkpoint.prev.pt and clients.csv: files the new run below would not write itself
    train(compose_config("rounds=2", "device=cpu", "checkpoint_every=1", "eval.per_client=true"), folder)
    before = snapshot(folder)
    proc = run_cli("seed=5", "rounds=2", "device=cpu", f"hydra.run.dir={folder}", cwd=ROOT)
    refusal = holds(folder, "a completed run (seed=0, 2 rounds)")
    assert proc.returncode == 2 and messages(proc.stdout + proc.stderr) == [refusal]
    assert snapshot(folder) == before  # the refusal is not logged into the folder it leaves unchanged
    with pytest.raises(SetupError) as info:
        train(compose_config("seed=5", "rounds=1", "device=cpu", "resume=true", "overwrite=true"), folder)
    assert str(info.value) == ("resume=true and overwrite=true contradict each other: resume=true continues the run "
                               "in the folder, overwrite=true replaces it; choose one")
    assert snapshot(folder) == before
    with caplog.at_level(logging.WARNING):
        summary = train(compose_config("seed=5", "rounds=1", "device=cpu", "overwrite=true"), folder)
    assert f"overwrite=true: removed a completed run (seed=0, 2 rounds) from {folder}" in caplog.messages
    assert summary["seed"] == 5 and summary["rounds_completed"] == 1
    # nothing of the old run is left beside the new one's files
    assert sorted(snapshot(folder)) == ["checkpoint.pt", "config.yaml", "metrics.csv", "model.pt", "partition.json",
                                        "partition.png", "summary.json", "weights.csv"]
    assert torch.load(folder / "checkpoint.pt", weights_only=False)["summary"]["seed"] == 5


def test_a_setup_failure_or_hydras_files_are_no_run_but_an_unfinished_run_is(tmp_path):
    folder = tmp_path / "run"
    missing = ["rounds=1", "device=cpu", "dataset=cifar10", "data.root=/nonexistent", "data.download=false"]
    with pytest.raises(SetupError, match="^cifar10 not found"):
        train(compose_config(*missing), folder)
    assert sorted(snapshot(folder)) == ["summary.json"]  # the error; nothing computed
    with pytest.raises(SetupError, match="^cifar10 not found"):  # tried again: its own error replaces the first
        train(compose_config(*missing, "seed=3"), folder)
    assert json.loads((folder / "summary.json").read_text())["seed"] == 3
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (folder / "run.log").write_text("[2026-01-01 00:00:00,000][fedagg][INFO] - a launch\n")
    assert train(compose_config("rounds=1", "device=cpu"), folder)["status"] == "completed"
    # a run killed before it wrote its summary: what it computed is refused as a run
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    for name in ("metrics.csv", "checkpoint.pt"):
        shutil.copy(folder / name, unfinished / name)
    before = snapshot(unfinished)
    with pytest.raises(SetupError) as info:
        train(compose_config("rounds=1", "device=cpu"), unfinished)
    assert str(info.value) == holds(unfinished, "the files of a run that did not finish (metrics.csv, checkpoint.pt)")
    assert snapshot(unfinished) == before


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """The job folders `-m rounds=1 device=cpu seed=0,1` leaves (written in this process: no launch to wait for)."""
    sweep = tmp_path_factory.mktemp("swept")
    for seed in (0, 1):
        train(compose_config("rounds=1", "device=cpu", f"seed={seed}"), sweep / str(seed))
    return sweep


@pytest.mark.slow  # a CLI sweep or several subprocess runs: ~8-10 s on 2 idle cores
def test_a_sweep_rerun_into_its_folder_refuses_every_job_and_says_they_failed(swept, tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(swept, sweep)
    before = {i: snapshot(sweep / str(i)) for i in (0, 1)}
    proc = run_cli("-m", "rounds=1", "device=cpu", f"hydra.sweep.dir={sweep}", "seed=0,1", cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out
    assert messages(out)[-3:] == [f"sweep {sweep}: 2 failed",
                                  "failed: " + holds(sweep / "0", "a completed run (seed=0, 1 round)"),
                                  "failed: " + holds(sweep / "1", "a completed run (seed=1, 1 round)")]
    for i in (0, 1):
        assert_unchanged(sweep / str(i), before[i])
    assert sorted(p.name for p in sweep.iterdir()) == ["0", "1", "multirun.yaml"]  # the sweep's ledger is gone


def test_a_sweep_resumed_with_other_values_counts_the_refused_job_as_failed(swept, tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(swept, sweep)
    before = {i: snapshot(sweep / str(i)) for i in (0, 1)}
    # Hydra numbers the jobs anew: seed=0's job finds its run (skipped), seed=2's job meets seed=1's run in folder 1
    proc = run_cli("-m", "rounds=1", "device=cpu", f"hydra.sweep.dir={sweep}", "seed=0,2", "resume=true", cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out
    assert messages(out)[-3:] == [
        f"sweep {sweep}: 1 completed, 1 failed",
        f"failed: {sweep / '1'}: resume=true but {sweep / '1'} holds a completed run whose configuration differs in "
        "seed; nothing there was changed: use a new hydra.run.dir",
        "a sweep numbers its jobs' folders in the order of its values, so one re-launched with other values meets "
        "other runs there: use another hydra.sweep.dir, or name the folders by their values with "
        "hydra.sweep.subdir='${hydra.job.override_dirname}'"]
    assert f"{sweep / '0'} already completed; skipping it (resume=true)" in messages(out)
    assert_unchanged(sweep / "0", before[0])
    assert_unchanged(sweep / "1", before[1])


@pytest.mark.slow  # a CLI sweep or several subprocess runs: ~8-10 s on 2 idle cores
def test_a_sweep_into_one_folder_refuses_the_second_job(tmp_path):
    proc = run_cli("-m", "rounds=1", "device=cpu", f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=same", "seed=0,1",
                   cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out
    assert messages(out)[-2:] == [f"sweep {tmp_path}: 1 completed, 1 failed",
                                  "failed: " + holds(tmp_path / "same", "a completed run (seed=0, 1 round)")]
    assert json.loads((tmp_path / "same" / "summary.json").read_text())["seed"] == 0
