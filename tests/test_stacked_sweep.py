"""hydra/launcher=stacked: a sweep's jobs trained together give each job the files it gets run alone.

Six jobs (FedAvg and SCAFFOLD x 3 seeds, all with stragglers, partial participation, momentum and kept
optimizer state) on the digits MLP: the stacked sweep against the same sweep through the basic launcher
(each job alone, engine=parallel), file by file; a stacked sweep killed with SIGKILL mid-round and launched
again finishes with the same files; a job that fails or diverges leaves the others completed.
"""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from omegaconf import OmegaConf

from conftest import ROOT

JOBS = ["aggregator=fedavg,scaffold", "seed=0,1,2"]
COMMON = ["engine=parallel", "rounds=4", "checkpoint_every=1", "resume=true", "system=stragglers",
          "clients_per_round=6", "client.momentum=0.9", "client.keep_optimizer_state=true", "device=cpu"]
VARIABLE = {"elapsed_s", "wall_time_s", "finished_at", "group_started_at"}  # wall-clock figures


def sweep(folder, *extra, launcher="stacked", wait=True):
    cmd = [sys.executable, "-m", "fedagg.run", "-m", *COMMON, *JOBS, *extra, f"hydra.sweep.dir={folder}"]
    if launcher:
        cmd.append(f"hydra/launcher={launcher}")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def rows(path):
    with open(path) as f:
        return [{k: v for k, v in row.items() if k not in VARIABLE} for row in csv.DictReader(f)]


def summary(path):
    s = json.loads(path.read_text())
    return {k: v for k, v in s.items() if k not in VARIABLE}


def assert_same_job(a, b):
    assert rows(a / "metrics.csv") == rows(b / "metrics.csv")  # every figure as written, to its last digit
    assert rows(a / "weights.csv") == rows(b / "weights.csv")
    assert summary(a / "summary.json") == summary(b / "summary.json")
    assert (a / "partition.json").read_text() == (b / "partition.json").read_text()
    assert (a / "config.yaml").read_text() == (b / "config.yaml").read_text()
    ma, mb = torch.load(a / "model.pt"), torch.load(b / "model.pt")
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    folder = tmp_path_factory.mktemp("alone")
    done = sweep(folder, launcher=None)  # the basic launcher: one job after another
    assert done.returncode == 0, done.stdout + done.stderr
    return folder


@pytest.mark.slow
def test_a_stacked_sweep_equals_its_jobs_run_alone(alone, tmp_path):
    done = sweep(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "jobs #0, #1, #2, #3, #4, #5 train together" in done.stdout + done.stderr
    assert "6 completed" in done.stdout + done.stderr
    for job in range(6):
        assert_same_job(tmp_path / str(job), alone / str(job))
    assert "scaffold" in json.loads((tmp_path / "5" / "summary.json").read_text())["choices"]["aggregator"]


@pytest.mark.slow
def test_a_killed_stacked_sweep_finishes_with_the_same_files(alone, tmp_path):
    proc = sweep(tmp_path, wait=False)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:  # kill once some job has a checkpoint, none is done
        if any((tmp_path / str(j) / "checkpoint.pt").exists() for j in range(6)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stdout.read()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not all((tmp_path / str(j) / "summary.json").exists() for j in range(6))  # it stopped mid-sweep
    done = sweep(tmp_path)  # the same command
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resuming after round" in done.stdout + done.stderr
    for job in range(6):
        assert_same_job(tmp_path / str(job), alone / str(job))


@pytest.mark.slow
def test_a_ctrl_c_stops_every_job_after_its_round_and_the_same_command_finishes_them(alone, tmp_path):
    """One Ctrl-C: each job of the group stops after its round with a checkpoint (`status: interrupted`), the sweep
    exits 130; the same command continues them to the files of the jobs run alone. What Hydra's run_job did for a
    job the launcher does for the group's: each job's log lines in its own run.log, its .hydra/ files."""
    proc = sweep(tmp_path, "hydra.output_subdir=.hydra", wait=False)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:  # once some job has a checkpoint, none is done
        if any((tmp_path / str(j) / "checkpoint.pt").exists() for j in range(6)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stdout.read()
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, out
    assert "SIGINT received: stopping the sweep" in out and "6 interrupted" in out, out
    for j in range(6):
        folder = tmp_path / str(j)
        s = summary(folder / "summary.json")
        assert s["status"] == "interrupted" and 1 <= s["rounds_completed"] < 4, s
        assert (folder / "checkpoint.pt").exists()
        log = (folder / "run.log").read_text()
        assert f"interrupted: final test accuracy" in log and f"({folder})" in log
        assert not any(f"({tmp_path / str(k)})" in log for k in range(6) if k != j), log  # its own lines only
        assert sorted(p.name for p in (folder / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
        assert f"seed={j % 3}" in (folder / ".hydra" / "overrides.yaml").read_text()
    done = sweep(tmp_path, "hydra.output_subdir=.hydra")  # the same command
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 completed" in done.stdout + done.stderr
    for job in range(6):
        assert_same_job(tmp_path / str(job), alone / str(job))


@pytest.mark.slow
def test_a_failing_and_a_diverging_job_leave_the_others_completed(tmp_path):
    cmd = [sys.executable, "-m", "fedagg.run", "-m", "engine=parallel", "rounds=3", "device=cpu",
           "client.lr=0.05,-1,1e30", "seed=0,1", "hydra/launcher=stacked", f"hydra.sweep.dir={tmp_path}"]
    done = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "2 completed, 2 diverged, 2 failed" in out
    assert "client.lr=-1 is not allowed; it must be > 0" in out
    statuses = [json.loads((tmp_path / str(j) / "summary.json").read_text())["status"] for j in range(6)]
    assert statuses == ["completed", "completed", "failed", "failed", "diverged", "diverged"]


@pytest.mark.slow
def test_each_job_of_a_stacked_group_gets_its_own_wandb_run(tmp_path):
    cmd = [sys.executable, "-m", "fedagg.run", "-m", "engine=parallel", "rounds=2", "device=cpu", "seed=0,1",
           "logger=wandb", "logger.mode=offline", "hydra/launcher=stacked", f"hydra.sweep.dir={tmp_path}"]
    done = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1", WANDB_SILENT="true"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [list((tmp_path / str(j) / "wandb").glob("offline-run-*")) for j in range(2)]
    assert [len(r) for r in runs] == [1, 1]  # one run each, in its own job's folder
    assert all(list(r[0].glob("run-*.wandb")) for r in runs)  # the files `wandb sync` uploads
    assert runs[0][0].name.rpartition("-")[2] != runs[1][0].name.rpartition("-")[2]  # two run ids


def _composed(*overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=["device=cpu", *overrides], return_hydra_config=True)


def test_jobs_group_by_model_and_local_training_shape_and_others_say_why():
    from hydra_plugins.fedagg_stacked_launcher.stacked_launcher import form_groups, group_key

    keys = [group_key(_composed(*o)) for o in (
        ["engine=parallel"],
        ["engine=parallel", "aggregator=scaffold", "seed=3", "client.lr=0.2", "system=stragglers", "attack=sign_flip",
         "partition.alpha=0.1"],
        ["engine=parallel", "model=mlr"],
        ["engine=sequential"],
        ["engine=parallel", "deterministic=true"],
        ["engine=parallel", "client.batch_size=16"],
        ["engine=parallel", "client/objective=fedprox"],  # another loss: its own call in the same computation
        ["seed=5"],  # engine=auto: the user asked for stacking, which the parallel engine trains
    )]
    assert keys[0][0] is not None and keys[1][0] == keys[0][0] == keys[6][0] == keys[7][0]
    assert len({keys[0][0], keys[2][0], keys[5][0]}) == 3
    assert keys[3] == (None, "stacked rounds are trained by the parallel engine and this job runs engine=sequential "
                             "on cpu: add engine=parallel to train it with the others")
    assert keys[4] == (None, "deterministic=true is a process-wide torch setting")
    groups = form_groups(keys, max_group=2)
    assert [g for g, _ in groups] == [[0, 1], [2], [3], [4], [5], [6, 7]]


def test_an_engine_auto_job_of_a_group_gets_the_parallel_engine_with_its_options():
    from fedagg.engines.auto import recorded_engine, stacked_alike
    from hydra_plugins.fedagg_stacked_launcher.stacked_launcher import trained_stacked

    cfg = _composed("engine.eval_batch_size=512")
    OmegaConf.set_readonly(cfg.hydra, True)  # as Hydra hands a sweep's configs to the launcher
    auto = {"_target_": "fedagg.engines.auto.auto_engine", "device": "cpu", "eval_batch_size": 512,
            "chunk_size": "auto", "precision": "fp32", "channels_last": False, "compile": False}
    assert trained_stacked(cfg)
    parallel = {"_target_": "fedagg.engines.parallel.ParallelEngine", "eval_batch_size": 512, "chunk_size": "auto",
                "precision": "fp32", "channels_last": False, "compile": False}
    assert OmegaConf.to_container(cfg.engine, resolve=True) == parallel
    assert cfg.hydra.runtime.choices.engine == "parallel"
    assert not trained_stacked(cfg) and not trained_stacked(_composed("engine=sequential"))  # nothing to change
    assert stacked_alike(auto, parallel) and stacked_alike(parallel, auto)
    assert not stacked_alike(auto, dict(parallel, eval_batch_size=1024)) and not stacked_alike(auto, auto)
    assert recorded_engine(parallel, auto) == parallel and recorded_engine(auto, parallel) == auto
    assert recorded_engine(auto, auto) is None


@pytest.mark.slow
def test_a_second_ctrl_c_stops_a_stacked_group_in_the_middle_of_its_round(tmp_path):
    """Rounds of about a minute (3,000 local epochs): the first Ctrl-C asks for a stop after the round, the second stops the
    group's round at its next step; each job says so and keeps `status: interrupted`, and the sweep exits 130."""
    cmd = [sys.executable, "-m", "fedagg.run", "-m", "engine=parallel", "rounds=2", "device=cpu", "seed=0,1",
           "client.local_epochs=3000", "hydra/launcher=stacked", f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not all((tmp_path / str(j) / "partition.json").exists() for j in range(2)):
            time.sleep(0.05)
        time.sleep(2)  # the group is in its first round
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.5)
        asked = time.time()
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=300)
        took = time.time() - asked
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out
    assert "SIGINT received again: the running jobs stop now" in out
    assert out.count("stopped at once; resume=true with the same settings continues from round 1") == 2, out
    for j in range(2):
        s = json.loads((tmp_path / str(j) / "summary.json").read_text())
        assert s["status"] == "interrupted" and s.get("rounds_completed", 0) == 0, s
    assert not (tmp_path / "0" / "metrics.csv").exists() or len(rows(tmp_path / "0" / "metrics.csv")) == 0
    # a round of this group took 55 s on a 2-core CPU; the second Ctrl-C stops it within a few steps
    assert took < 10, (took, out)


def test_a_model_with_dropout_runs_alone_and_says_why():
    """Its masks come from one generator for the whole stacked call: its result would depend on its group."""
    from hydra_plugins.fedagg_stacked_launcher.stacked_launcher import form_groups, group_key

    keys = [group_key(_composed("engine=parallel", "model=cnn_emnist_tff", *o)) for o in (
        [], ["seed=1"], ["model.dropout_conv=0", "model.dropout_dense=0"], ["model.dropout_conv=0", "seed=1"],
        ["model.dropout_conv=0", "model.dropout_dense=0", "seed=1"])]
    assert keys[0] == (None, "its model draws dropout masks while it trains (model.dropout_conv=0.25, "
                             "model.dropout_dense=0.5), and a stacked call draws them for all its runs' clients from "
                             "one generator: its result would depend on the runs beside it")
    assert keys[1] == keys[0]
    assert keys[3] == (None, keys[0][1].replace("model.dropout_conv=0.25, ", ""))
    assert keys[2][0] is not None and keys[4][0] == keys[2][0]  # without dropout it stacks
    assert [g for g, _ in form_groups(keys, max_group=8)] == [[0], [1], [2, 4], [3]]


def test_a_projection_head_is_a_model_of_its_own_and_the_other_new_methods_stack_with_fedavg():
    from hydra_plugins.fedagg_stacked_launcher.stacked_launcher import group_key

    keys = [group_key(_composed("engine=parallel", "model=cnn_bn", *o)) for o in (
        [],
        ["client/objective=moon"],  # MOON's projection head under the classifier: another structure
        ["client/objective=moon", "client.objective.projection=none"],
        ["client/objective=fedlc"], ["client/objective=fedntd"], ["client/objective=feddecorr"],
        ["aggregator=fedbn"], ["aggregator=elastic"],
        ["client/objective=moon", "client.objective.projection_dim=64"],
    )]
    assert all(k is not None for k, _ in keys)
    assert len({keys[0][0], keys[1][0], keys[8][0]}) == 3
    assert {k for k, _ in keys[2:8]} == {keys[0][0]}
