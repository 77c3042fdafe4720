"""A sweep of the basic launcher says its start-up once on the console (fedagg/edge/start_up.py), as the stacked
launcher does; each job's run.log keeps its own start-up, and Hydra's `#N : overrides` line maps a job to its
settings."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

from hydra.types import RunMode
from omegaconf import OmegaConf

from conftest import ROOT
from fedagg.edge.start_up import SaidOnce, StartUpOnce, preparing


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_start_up_line_passes_once_and_every_other_line_always():
    log = logging.getLogger("test_sweep_start_up")
    log.propagate = False
    shown = Lines()
    shown.addFilter(SaidOnce())
    log.addHandler(shown)
    try:
        for job in range(3):
            with preparing():
                log.warning("digits: 1437 train")  # every job's start-up says it
                log.warning(f"job {job}'s own note")  # a start-up line of one job only
            log.warning("round 1/1 acc=0.25")  # the same round line in two jobs is two lines
        with preparing():
            log.error("digits: 1437 train")  # the same text at another level is another line
    finally:
        log.removeHandler(shown)
    assert shown.lines == ["digits: 1437 train", "job 0's own note", "round 1/1 acc=0.25", "job 1's own note",
                           "round 1/1 acc=0.25", "job 2's own note", "round 1/1 acc=0.25", "digits: 1437 train"]


def test_the_callback_filters_the_console_of_a_sweeps_job_only():
    console, run_log = logging.StreamHandler(), logging.FileHandler(os.devnull)
    root = logging.getLogger()
    root.addHandler(console)
    root.addHandler(run_log)
    try:
        callback = StartUpOnce()
        callback.on_job_start(OmegaConf.create({"hydra": {"mode": RunMode.RUN}}))
        assert console.filters == []  # a single run says everything
        sweep = OmegaConf.create({"hydra": {"mode": RunMode.MULTIRUN}})
        callback.on_multirun_start(sweep)
        callback.on_job_start(sweep)
        callback.on_job_start(sweep)  # a job whose logging Hydra did not configure anew: still one filter
        assert console.filters == [callback.said] and run_log.filters == []
    finally:
        root.removeHandler(console)
        root.removeHandler(run_log)
        run_log.close()


def test_a_basic_sweep_says_its_start_up_once_and_each_run_log_keeps_it(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedagg.run", "-m", "aggregator=fedavg,fedadam,fedadp", "rounds=1",
                           "num_clients=4", f"hydra.sweep.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert out.count("digits: 1437 train / 360 test samples, 4 clients") == 1, out  # not once a job
    assert out.count("computing with 1 torch thread(s)") == 1, out
    assert len(re.findall(r"completed: final test accuracy \S+ after 1 rounds", out)) == 3, out
    for num, method in enumerate(["fedavg", "fedadam", "fedadp"]):
        assert f"#{num} : aggregator={method} rounds=1 num_clients=4" in out  # Hydra's line before each job
        log = (tmp_path / str(num) / "run.log").read_text()
        assert "digits: 1437 train / 360 test samples, 4 clients" in log and "computing with" in log
