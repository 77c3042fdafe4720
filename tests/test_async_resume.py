"""An asynchronous run stopped and resumed (an interrupt after a server step, a SIGKILL of a real process) writes
the files of the run that never stopped: the checkpoint holds the clients in flight with their trained results,
the event queue, the buffer and the rule's state."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT, compose_config
from fedagg.run import train
from stopping import FedBuffStop

TESTS = str(ROOT / "tests")
RUN = ["device=cpu", "partition=iid", "checkpoint_every=2", "aggregator=fedbuff", "aggregator.buffer_size=3",
       "aggregator.optimizer=adam", "aggregator.lr=0.01", "server=async", "server.concurrency=5", "clock=lognormal",
       "clock.jitter=0.3", "target_acc=0.3", "aggregator._target_=stopping.FedBuffStop"]
VARIABLE = {"elapsed_s", "wall_time_s", "finished_at"}


def rows(path):
    with open(path) as f:
        return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in csv.DictReader(f)]


def assert_same_files(a, b):
    assert rows(a / "metrics.csv") == rows(b / "metrics.csv")
    assert (a / "weights.csv").read_text() == (b / "weights.csv").read_text()
    ma, mb = torch.load(a / "model.pt"), torch.load(b / "model.pt")
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    for s in (sa, sb):  # resume=true is the one setting they differ in
        s["config"].pop("resume")
        s.pop("overrides")
    assert {k: v for k, v in sa.items() if k not in VARIABLE} == {k: v for k, v in sb.items() if k not in VARIABLE}


def stop_after_step(run: list[str], stop_at: int, folder) -> None:
    """Train `run` for 8 server steps in `folder`, stopped (Ctrl-C, FedBuffStop) after step `stop_at`."""
    FedBuffStop.at = stop_at
    try:
        stopped = train(compose_config(*run, "rounds=8"), folder)
    finally:
        FedBuffStop.at = None
    assert stopped["status"] == "interrupted" and stopped["rounds_completed"] == stop_at


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reference")
    summary = train(compose_config(*RUN, "rounds=8"), folder)
    assert summary["status"] == "completed"
    return folder


@pytest.mark.parametrize("stop_at", [3, 4])  # after a step, and after a checkpoint_every step
def test_stopped_after_a_server_step_and_resumed_gives_the_uninterrupted_files(stop_at, reference, tmp_path):
    stop_after_step(RUN, stop_at, tmp_path)
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    flights = ckpt["schedule"]["flights"]
    assert len(flights) + ckpt["schedule"]["owed"] == 5 and all(f["trained"] is not None for f in flights)
    summary = train(compose_config(*RUN, "rounds=8", "resume=true"), tmp_path)
    assert summary["status"] == "completed"
    assert_same_files(tmp_path, reference)


def test_an_asynchronous_run_records_time_staleness_and_time_to_target(reference):
    metrics, weights = rows(reference / "metrics.csv"), rows(reference / "weights.csv")
    summary = json.loads((reference / "summary.json").read_text())
    assert [int(r["round"]) for r in metrics] == list(range(1, 9))  # a row per server version
    assert [int(r["client_updates"]) for r in metrics] == [3 * r for r in range(1, 9)]
    times = [float(r["sim_time"]) for r in metrics]
    assert times == sorted(times) and times[0] > 0 and summary["final_sim_time"] == times[-1]
    assert len(weights) == 24 and {r["round"] for r in weights} == {str(r) for r in range(1, 9)}
    for row in metrics:
        ages = [int(w["staleness"]) for w in weights if w["round"] == row["round"]]
        assert float(row["staleness_mean"]) == pytest.approx(sum(ages) / 3) and int(row["staleness_max"]) == max(ages)
    assert max(int(w["staleness"]) for w in weights) > 0
    first = next(r for r in metrics if float(r["test_acc"]) >= 0.3)
    assert summary["rounds_to_target"] == int(first["round"]) and summary["time_to_target"] == float(first["sim_time"])
    # bits: down at each dispatch (5 at the start), up at each arrival (3 a step)
    up, down = int(metrics[0]["bits_up"]), int(metrics[0]["bits_down"])
    assert up % 3 == 0 and down % (up // 3) == 0 and down // (up // 3) >= 5


def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path):
    slow = [*RUN, "rounds=30", "client.local_epochs=6"]
    reference = tmp_path / "reference"
    train(compose_config(*slow), reference)
    killed = tmp_path / "killed"
    env = dict(os.environ, PYTHONPATH=TESTS)
    proc = subprocess.Popen([sys.executable, "-m", "fedagg.run", *slow, f"hydra.run.dir={killed}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    end = time.time() + 120
    while not (killed / "checkpoint.pt").exists():
        if time.time() >= end:
            proc.kill()
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = torch.load(killed / "checkpoint.pt", weights_only=False)["round"]
    assert saved < 30 and not (killed / "summary.json").exists()  # it really died mid-run
    summary = train(compose_config(*slow, "resume=true"), killed)
    assert summary["status"] == "completed" and summary["rounds_completed"] == 30
    assert_same_files(killed, reference)
