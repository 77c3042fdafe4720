"""engine=auto under hydra/launcher=stacked: the jobs of a group train with the parallel engine, say so once, and
record it; such a job resumed alone keeps the parallel engine (and one that ran alone, resumed stacked, its own).

The digits MLP: each client's arithmetic is its own whichever runs share a call, so a job trained stacked gives
the files of the same job run alone with engine=parallel (compared to 1e-6 relative, as in test_drivers.py)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from fedagg.run import run_experiment
from fedagg.runtime.interrupts import clear_stop_request, request_stop
import test_drivers

PARALLEL, AUTO = "fedagg.engines.parallel.ParallelEngine", "fedagg.engines.auto.auto_engine"
COMMON = ["device=cpu", "rounds=3", "num_clients=6", "checkpoint_every=1"]


def assert_same_run(a, b):
    """Files equal to 1e-6 relative (test_drivers.py); the summaries but the overrides, as typed, and wall times."""
    saved = set(test_drivers.VARIABLE)
    test_drivers.VARIABLE |= {"overrides"}
    try:
        test_drivers.assert_same_run(a, b)
    finally:
        test_drivers.VARIABLE.clear()
        test_drivers.VARIABLE.update(saved)


def stopped_after_round_1(overrides, folder):
    request_stop()  # as a first Ctrl-C: the run stops after its first round, with a checkpoint
    try:
        assert run_experiment(overrides, folder)["status"] == "interrupted"
    finally:
        clear_stop_request()


def test_a_job_trained_stacked_with_engine_auto_resumes_alone_with_the_parallel_engine(tmp_path):
    """The stacked job records the parallel engine's node with engine=auto's options: engine=parallel's here."""
    reference = run_experiment([*COMMON, "engine=parallel", "resume=true"], tmp_path / "reference")  # as resumed
    stopped_after_round_1([*COMMON, "engine=parallel"], tmp_path / "job")
    resumed = run_experiment([*COMMON, "resume=true"], tmp_path / "job")  # engine=auto: sequential on the CPU alone
    assert resumed["status"] == "completed" and resumed["config"]["engine"]["_target_"] == PARALLEL
    assert_same_run(tmp_path / "job", tmp_path / "reference")
    assert reference["config"]["engine"] == resumed["config"]["engine"]
    again = run_experiment([*COMMON, "resume=true"], tmp_path / "job")  # completed: skipped, not refused
    assert again["status"] == "completed"


def test_a_job_begun_alone_with_engine_auto_keeps_its_engine_when_resumed_stacked(tmp_path):
    """Stacked, its config asks for the parallel engine; its checkpoint says engine=auto (sequential) trained it."""
    run_experiment([*COMMON, "resume=true"], tmp_path / "reference")
    stopped_after_round_1([*COMMON], tmp_path / "job")
    resumed = run_experiment([*COMMON, "engine=parallel", "resume=true"], tmp_path / "job")
    assert resumed["status"] == "completed" and resumed["config"]["engine"]["_target_"] == AUTO
    assert_same_run(tmp_path / "job", tmp_path / "reference")


def test_engine_parallel_options_that_differ_are_still_refused_on_resume(tmp_path):
    stopped_after_round_1([*COMMON, "engine=parallel", "engine.eval_batch_size=512"], tmp_path / "job")
    from fedagg.run import FolderHeld

    with pytest.raises(FolderHeld, match="differs from the checkpoint's in engine"):
        run_experiment([*COMMON, "resume=true"], tmp_path / "job")


def sweep(folder, *extra):
    cmd = [sys.executable, "-m", "fedagg.run", "-m", *COMMON, "seed=0,1", "aggregator=fedavg,fedadam", *extra,
           f"hydra.sweep.dir={folder}"]
    done = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.mark.slow
def test_a_stacked_sweep_trains_engine_auto_jobs_with_the_parallel_engine_and_says_so_once(tmp_path):
    out = sweep(tmp_path / "stacked", "hydra/launcher=stacked")
    assert out.count("engine=auto: jobs trained together use the parallel engine") == 1, out
    assert "jobs #0, #1, #2, #3 train together" in out
    assert out.count("engine.chunk_size=auto: ") == 1, out  # the group's engine; not again for each job's own
    sweep(tmp_path / "alone", "engine=parallel")  # the basic launcher, one job after another
    for job in range(4):
        stacked = tmp_path / "stacked" / str(job)
        assert_same_run(stacked, tmp_path / "alone" / str(job))  # summaries equal: config and choices included
        summary = json.loads((stacked / "summary.json").read_text())
        assert summary["config"]["engine"]["_target_"] == PARALLEL and summary["choices"]["engine"] == "parallel"
    # the same sweep resumed with the basic launcher and engine=auto: each job completed, skipped, not refused
    out = sweep(tmp_path / "stacked", "resume=true")
    assert "4 completed" in out and out.count("already completed; skipping it") == 4, out
