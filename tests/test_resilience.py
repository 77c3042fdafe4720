"""Runs that survive: kill and resume, interrupts, divergence, failing sweep jobs, bad input."""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT, compose_config
from fedagg.aggregators.base import Aggregator
from fedagg.runtime.checkpoints import save_checkpoint
from fedagg.runtime.interrupts import StopRequests
from fedagg.run import train

TESTS = str(ROOT / "tests")
SLOW_RUN = ["rounds=12", "device=cpu", "client.local_epochs=4", "checkpoint_every=2"]


class NaNAtRound2(Aggregator):
    def server_update(self, inputs, update):
        return inputs.global_params + update * (float("nan") if inputs.round == 2 else 1.0)


class CtrlCTwiceInRound3(Aggregator):
    """FedAvg; with FEDAGG_TEST_CTRL_C set, its process gets Ctrl-C twice in round 3 (after round 2's checkpoint)."""

    def server_update(self, inputs, update):
        if inputs.round == 3 and os.environ.get("FEDAGG_TEST_CTRL_C"):
            os.kill(os.getpid(), signal.SIGINT)  # handled at once: stop after this round
            os.kill(os.getpid(), signal.SIGINT)  # and again: stop now
        return super().server_update(inputs, update)


class Boom(Aggregator):
    def server_update(self, inputs, update):
        raise RuntimeError("boom in round %d" % inputs.round)


def _rows(path):
    with open(path) as f:
        return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in csv.DictReader(f)]


def _start(run_dir, *overrides):
    env = dict(os.environ, PYTHONPATH=TESTS)
    cmd = [sys.executable, "-m", "fedagg.run", *SLOW_RUN, f"hydra.run.dir={run_dir}", *overrides]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_for(path, proc, timeout=120):
    end = time.time() + timeout
    while not path.exists():
        if time.time() >= end:
            proc.kill()  # a run that outlives its test would hold CI's output open
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        time.sleep(0.01)


def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path):
    reference = tmp_path / "reference"
    train(compose_config(*SLOW_RUN), reference)
    killed = tmp_path / "killed"
    proc = _start(killed)
    _wait_for(killed / "checkpoint.pt", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = torch.load(killed / "checkpoint.pt", weights_only=False)["round"]
    assert saved < 12 and not (killed / "summary.json").exists()  # it really died mid-run
    summary = train(compose_config(*SLOW_RUN, "resume=true"), killed)
    assert summary["status"] == "completed" and summary["rounds_completed"] == 12
    # every column but the wall-clock one is identical to the run that was never stopped
    assert _rows(killed / "metrics.csv") == _rows(reference / "metrics.csv")
    assert (killed / "weights.csv").read_text() == (reference / "weights.csv").read_text()
    a, b = torch.load(killed / "model.pt"), torch.load(reference / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigint_writes_interrupted_summary_and_a_resumable_checkpoint(tmp_path):
    proc = _start(tmp_path)
    _wait_for(tmp_path / "checkpoint.pt", proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) != 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 0 < summary["rounds_completed"] < 12
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert ckpt["round"] == summary["rounds_completed"]
    assert len(_rows(tmp_path / "metrics.csv")) == summary["rounds_completed"]
    resumed = train(compose_config(*SLOW_RUN, "resume=true"), tmp_path)
    assert resumed["status"] == "completed"
    assert [int(r["round"]) for r in _rows(tmp_path / "metrics.csv")] == list(range(1, 13))


def test_resume_skips_a_completed_run_and_refuses_a_changed_config(tmp_path):
    first = train(compose_config("rounds=2", "device=cpu"), tmp_path)
    before = (tmp_path / "metrics.csv").read_text()
    again = train(compose_config("rounds=2", "device=cpu", "resume=true"), tmp_path)
    assert again["wall_time_s"] == first["wall_time_s"] and (tmp_path / "metrics.csv").read_text() == before
    (tmp_path / "summary.json").unlink()  # as if stopped before the end: only the checkpoint is left
    with pytest.raises(ValueError, match=r"configuration differs from the checkpoint's in client.lr"):
        train(compose_config("rounds=2", "device=cpu", "resume=true", "client.lr=0.1"), tmp_path)


def test_injected_nan_stops_the_run_as_diverged(tmp_path):
    summary = train(compose_config("rounds=5", "device=cpu", f"aggregator._target_={__name__}.NaNAtRound2"), tmp_path)
    assert summary["status"] == "diverged" and summary["diverged_round"] == 2 and summary["rounds_completed"] == 2
    rows = _rows(tmp_path / "metrics.csv")
    assert [r["round"] for r in rows] == ["1", "2"] and rows[1]["test_acc"] == ""
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "diverged"


def test_a_failing_job_is_recorded_and_the_sweep_finishes_the_others(tmp_path):
    targets = f"fedagg.aggregators.base.FedAvg,{__name__}.Boom,fedagg.aggregators.base.FedAvg"
    cmd = [sys.executable, "-m", "fedagg.run", "-m", "rounds=1", "device=cpu", f"hydra.sweep.dir={tmp_path}",
           f"aggregator._target_={targets}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=TESTS), capture_output=True)
    assert proc.returncode == 1  # the sweep ran every job, then says one failed
    status = [json.loads((tmp_path / str(i) / "summary.json").read_text())["status"] for i in range(3)]
    assert status == ["completed", "failed", "completed"]
    failed = json.loads((tmp_path / "1" / "summary.json").read_text())
    assert "boom in round 1" in failed["error"]


BAD_INPUT = [
    ("rounds=0", r"^rounds=0 is not allowed; it must be an integer >= 1$"),
    ("num_clients=0", r"^num_clients=0 is not allowed"),
    ("clients_per_round=11", r"^clients_per_round=11 is not allowed; it must be an integer from 1 to num_clients=10"),
    ("eval_every=0", r"^eval_every=0 is not allowed"),
    ("target_acc=1.5", r"^target_acc=1.5 is not allowed; it must be a fraction in \(0, 1\]"),
    ("stop_at_target=true", r"^stop_at_target=true is not allowed; it needs a target_acc to stop at"),
    ("device=tpu", r"^device='tpu' is not allowed; choose one of auto, cpu, cuda$"),
    ("checkpoint_every=-1", r"^checkpoint_every=-1 is not allowed"),
    ("seed=abc", r"^seed='abc' is not allowed; it must be an integer$"),
    ("aggregator.weighting=size", r"^aggregator.weighting='size' is not allowed; choose one of samples, uniform$"),
    ("client.lr=-0.1", r"^client.lr=-0.1 is not allowed"),
    ("client.momentum=1.5", r"^client.momentum=1.5 is not allowed; it must be in \[0, 1\)$"),
    ("client.schedule=cosine", r"^client.schedule='cosine' is not allowed; choose one of constant, exponential, multistep$"),
    ("client.batch_size=0", r"^client.batch_size=0 is not allowed"),
    ("client.val_frac=1.0", r"^client.val_frac=1.0 is not allowed"),
    ("logger=wandb logger.mode=maybe", r"^logger.mode='maybe' is not allowed; choose one of online, offline, disabled$"),
    ("engine.eval_batch_size=0", r"^engine.eval_batch_size=0 is not allowed"),
    ("client/objective=fedprox client.objective.mu=-1", r"^client.objective.mu=-1 is not allowed"),
    ("aggregator=abavg client.val_frac=0.0", r"val_source=local\), but client.val_frac=0.0; set client.val_frac"),
    ("partition.alpha=0", r"^partition.alpha=0 is not allowed: it must be a finite number greater than 0.0 \(smaller "
                          r"is more skewed\)$"),
    ("partition=n_class partition.classes_per_client=11", r"^partition.classes_per_client=11 is not allowed"),
    ("partition.min_size=0 partition.alpha=0.0001 partition.max_retries=1",
     r"^dirichlet split failed: in partition.max_retries=1 draws with partition.alpha=0.0001 and num_clients=10, no "
     r"draw gave every client one sample, as no client may be empty \(partition.min_size=0\) \(the best smallest "
     r"client had 0\); raise partition.alpha, use fewer clients or raise partition.max_retries$"),
    ("aggregator=median aggregator.bucket_size=10",
     r"^aggregator.bucket_size=10 is not allowed with clients_per_round=10: one bucket would hold every client of a "
     r"round and the rule would be their plain mean; use a bucket_size below 10, or 1 for no bucketing$"),
    ("aggregator=centered_clip clients_per_round=4 aggregator.bucket_size=5",
     r"^aggregator.bucket_size=5 is not allowed with clients_per_round=4: "),
    ("eval.per_client=true client.val_frac=0.5 client.test_frac=0.6",
     r"^client.val_frac=0.5 and client.test_frac=0.6 are not allowed together: they hold out 110% of each client's "
     r"data and leave nothing to train on; their sum must be below 1$"),
    ("eval.per_client=true client.val_frac=0.8",
     r"^client.val_frac=0.8 and client.test_frac=null \(0.2\) are not allowed together: they hold out 100% "),
    ("num_clients=5000", r"num_clients=5000 is not allowed"),
    ("dataset=cifar10 data.root=/nonexistent data.download=false",
     r"cifar10 not found: no such folder in /nonexistent/cifar-10-batches-py"),
    ("data.download=maybe", r"^data.download=.maybe. is not allowed; it must be true or false$"),
    ("system=stragglers system.fraction=1.5", r"^system.fraction=1.5 is not allowed; it must be a number in \[0, 1\]$"),
    ("system=dropout system.p=1", r"^system.p=1 is not allowed; it must be a number in \[0, 1\)$"),
    ("system=dropout system.p=-0.2", r"^system.p=-0.2 is not allowed"),
    ("system=availability system.b=0", r"^system.b=0 is not allowed; it must be a finite number > 0"),
]


@pytest.mark.parametrize("overrides, message", BAD_INPUT, ids=[b for b, _ in BAD_INPUT])
def test_bad_input_gets_its_own_message_before_training(tmp_path, overrides, message):
    with pytest.raises(ValueError) as info:  # SetupError, what the command line prints
        train(compose_config("rounds=1", "device=cpu", *overrides.split()), tmp_path)
    assert type(info.value).__name__ == "SetupError"
    assert __import__("re").search(message, str(info.value)), str(info.value)
    assert not (tmp_path / "metrics.csv").exists() and not (tmp_path / "checkpoint.pt").exists()


def test_command_line_prints_only_the_message(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedagg.run", "client.momentum=1.5", f"hydra.run.dir={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    out = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(out) == 1 and out[0].endswith("client.momentum=1.5 is not allowed; it must be in [0, 1)")


def test_command_line_notes_degenerate_but_legal_settings_in_one_line_each_before_loading(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedagg.run", "rounds=1", "attack=sign_flip", "attack.fraction=0.05",
                           "aggregator=trimmed_mean", "clients_per_round=9", f"hydra.run.dir={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line.split(" - ", 1)[1] for line in (proc.stdout + proc.stderr).splitlines() if "[fedagg]" in line]
    assert lines[:2] == [
        "aggregator.beta=0.1 trims nothing from 9 models a round (floor(beta * 9) = 0): the trimmed mean is the plain "
        "mean; a beta of at least 0.111 trims one value each side",
        "attack.fraction=0.05 corrupts nobody with num_clients=10 (floor(0.05 * 10) = 0): the run has no attacker; a "
        "fraction of at least 0.1 corrupts one client",
    ]
    assert lines[2].startswith("digits: ")  # both said before the data is loaded
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"


class RecordsNumerics(Aggregator):
    """FedAvg that notes torch's numeric switches while the run aggregates."""

    seen: list = []

    def client_weights(self, inputs):
        RecordsNumerics.seen.append((torch.are_deterministic_algorithms_enabled(),
                                     os.environ.get("CUBLAS_WORKSPACE_CONFIG"), torch.backends.cuda.matmul.allow_tf32))
        return super().client_weights(inputs)


@pytest.mark.slow  # ~15-20 s on 2 idle cores
def test_numeric_switches_hold_for_the_run_and_are_put_back(tmp_path, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")  # a user's value with which deterministic cuBLAS fails
    base = ["rounds=2", "device=cpu", "model=resnet20", "client.local_epochs=1",
            f"aggregator._target_={__name__}.RecordsNumerics"]
    RecordsNumerics.seen = []
    train(compose_config(*base, "deterministic=true", "tf32=true"), tmp_path / "a")
    assert set(RecordsNumerics.seen) == {(True, ":4096:8", False)}  # deterministic kernels, their workspace, no TF32
    # a second job in the same process (the basic launcher's sweep) starts from the user's settings again
    assert not torch.are_deterministic_algorithms_enabled() and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":0:0"
    RecordsNumerics.seen = []
    train(compose_config(*base, "tf32=true"), tmp_path / "b")
    assert set(RecordsNumerics.seen) == {(False, ":0:0", True)} and not torch.backends.cuda.matmul.allow_tf32
    assert _rows(tmp_path / "a" / "metrics.csv") == _rows(tmp_path / "b" / "metrics.csv")  # the CPU is deterministic


@pytest.mark.slow  # ~15-20 s on 2 idle cores
def test_relaunched_sweep_with_resume_skips_completed_runs_and_finishes_the_rest(tmp_path):
    cmd = [sys.executable, "-m", "fedagg.run", "-m", "rounds=3", "device=cpu", "seed=0,1", f"hydra.sweep.dir={tmp_path}"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    done = json.loads((tmp_path / "0" / "summary.json").read_text())
    (tmp_path / "1" / "summary.json").unlink()  # job 1 as if killed after its last checkpoint
    subprocess.run(cmd + ["resume=true"], cwd=ROOT, check=True, capture_output=True)
    assert json.loads((tmp_path / "0" / "summary.json").read_text())["wall_time_s"] == done["wall_time_s"]
    again = json.loads((tmp_path / "1" / "summary.json").read_text())
    assert again["status"] == "completed" and again["rounds_completed"] == 3
    assert [r["round"] for r in _rows(tmp_path / "1" / "metrics.csv")] == ["1", "2", "3"]


def _messages(out):
    """Output lines without Hydra's time and logger prefix, nor the progress and setup lines of every run."""
    lines = [re.sub(r"^\[[^]]*\]\[[^]]*\](\[[A-Z]+\] -)? ?", "", line) for line in out.strip().splitlines()]
    return [line for line in lines if not re.match(r"round \d+/\d+ |digits: |computing with ", line)]


def test_a_second_ctrl_c_during_a_checkpoint_write_waits_for_it(tmp_path):
    before = signal.getsignal(signal.SIGINT)  # Python's handler; ignored when started in the background by a script
    with StopRequests() as stop:
        signal.raise_signal(signal.SIGINT)
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            with stop.writing():
                signal.raise_signal(signal.SIGINT)  # the second: the write goes on, then the run stops
                save_checkpoint(tmp_path, {"round": 1})
                done = True
    assert done and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]  # and no checkpoint.pt.tmp
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False) == {"round": 1}
    with StopRequests() as stop:  # the last write: nothing is left to stop after it
        signal.raise_signal(signal.SIGINT)
        with stop.writing(last=True):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before  # the handler the process had is put back


@pytest.mark.slow  # a CLI sweep or several subprocess runs: ~8-10 s on 2 idle cores
def test_ctrl_c_twice_stops_at_once_in_one_line_and_resumes(tmp_path):
    overrides = ["rounds=4", "device=cpu", "checkpoint_every=1", f"aggregator._target_={__name__}.CtrlCTwiceInRound3"]
    reference = train(compose_config(*overrides), tmp_path / "reference")
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "fedagg.run", *overrides, f"hydra.run.dir={run}"], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=TESTS, FEDAGG_TEST_CTRL_C="1"), capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 130 and "Traceback" not in out
    assert _messages(out) == [
        "SIGINT received: stopping after this round (Ctrl-C again to stop now)",
        "stopped at once; resume=true with the same settings continues from the checkpoint after round 2"]
    assert not list(run.glob("*.tmp"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds_completed"] == 2
    resumed = train(compose_config(*overrides, "resume=true"), run)
    assert resumed["status"] == "completed" and resumed["final_test_acc"] == reference["final_test_acc"]
    assert _rows(run / "metrics.csv") == _rows(tmp_path / "reference" / "metrics.csv")


SWEEP = ["rounds=12", "device=cpu", "client.local_epochs=4", "checkpoint_every=1"]
JOBLIB = ["hydra/launcher=joblib"]


SWEEP_STOPS = ("SIGINT received: stopping the sweep; its running jobs stop after their current round, the others do "
               "not begin")
RUN_STOPS = "SIGINT received: stopping after this round (Ctrl-C again to stop now)"


@pytest.mark.slow
@pytest.mark.parametrize("target, launch, running, counts, said", [
    # a terminal's Ctrl-C reaches every process; the third worker waits for a job that never comes
    ("group", [*JOBLIB, "hydra.launcher.n_jobs=3", "seed=0,1"], 2, "2 interrupted", SWEEP_STOPS),
    # the sweep's process alone: it passes the stop on; the third job does not begin
    ("parent", [*JOBLIB, "hydra.launcher.n_jobs=2", "seed=0,1,2"], 2, "2 interrupted, 1 not started", SWEEP_STOPS),
    # the basic launcher runs the jobs in turn in the sweep's process, whose round loop takes the signal; the
    # second job does not begin
    ("group", ["seed=0,1"], 1, "1 interrupted, 1 not started", RUN_STOPS)])
def test_ctrl_c_stops_a_sweep_in_one_line_and_every_job_resumes(tmp_path, target, launch, running, counts, said):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "fedagg.run", "-m", *SWEEP, *launch, f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=TESTS), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # its own process group
    try:
        end = time.time() + 240
        while not all((sweep / str(i) / "checkpoint.pt").exists() for i in range(running)):
            assert proc.poll() is None and time.time() < end
            time.sleep(0.05)
        if target == "group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # a sweep that outlives its test would hold CI's output open
            proc.wait()
    assert proc.returncode == 130 and "Traceback" not in out and "leaked" not in out
    lines = _messages(out)
    assert said in lines
    n = int(launch[-1].count(",")) + 1  # the jobs
    assert lines[-2:] == [f"sweep {sweep}: {counts}",
                          f"stopped: the same command with resume=true finishes the {n} interrupted and not started job(s)"]
    for i in range(running):
        summary = json.loads((sweep / str(i) / "summary.json").read_text())
        assert summary["status"] == "interrupted" and 0 < summary["rounds_completed"] < 12
    assert not list(sweep.rglob("*.tmp")) and not (sweep / ".jobs").exists()
    resumed = subprocess.run([*cmd, "resume=true"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=TESTS),
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0 and f"sweep {sweep}: {n} completed" in _messages(resumed.stdout + resumed.stderr)
    for i in range(n):
        assert [r["round"] for r in _rows(sweep / str(i) / "metrics.csv")] == [str(r) for r in range(1, 13)]
