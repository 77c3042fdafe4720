"""A sweep's jobs as one command: how many launch at once, and what the sweep says at its end and on Ctrl-C."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import sys
import threading
from collections import Counter
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from fedagg.runtime import interrupts, threads
from fedagg.tracking.files import write_json

LEDGER, LEDGER_ENV = ".jobs", "FEDAGG_SWEEP_LEDGER"  # each job's outcome, for the sweep's summary (SweepSummary)
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
log = logging.getLogger("fedagg")
_said: set[str] = set()  # the errors a sweep's jobs have said in this process


def first_time(error: str) -> bool:
    """Whether this process's jobs have not said `error` before (and it now counts as said): a sweep whose jobs all
    miss the same data says so once, not once a job."""
    new = error not in _said
    _said.add(error)
    return new


def listed(folders: list[str], most: int = 10) -> str:
    """`/sweep/ 0, 1, 2`: folders of one parent named once, at most `most` of them."""
    parents = {os.path.dirname(f) for f in folders}
    names = [os.path.basename(f) for f in folders] if len(parents) == 1 else folders
    text = ", ".join(names[:most]) + (" …" if len(names) > most else "")
    return f"{parents.pop()}/ {text}" if len(parents) == 1 else text


def concurrent_jobs(hydra_cfg) -> int:
    """Jobs the launcher runs at once on this machine: joblib's n_jobs (-1: every core), else one (the basic
    launcher runs them in turn; submitit gives each its own allocation)."""
    launcher = hydra_cfg.launcher
    if hydra_cfg.mode != RunMode.MULTIRUN or "joblib" not in str(launcher.get("_target_", "")).lower():
        return 1
    n = int(launcher.get("n_jobs") or 1)
    return n if n > 0 else max(1, threads.available_cores() + 1 + n)


class SweepSummary(Callback):
    """At the end of a sweep: how many of its jobs completed, diverged, failed or were interrupted, the failed ones'
    folders and errors, and a non-zero exit status when any failed or the sweep was stopped.

    It counts the jobs this sweep launched, not the summary.json files in its folder: a job refused because its
    folder holds another run writes nothing there, and a folder's summary may be an earlier sweep's. Each job
    records its outcome in a ledger of this sweep (`on_job_end` runs where the job runs: in this process, or in a
    joblib worker or a Slurm job, which find the ledger through the environment they inherit).

    Ctrl-C (or SIGTERM) stops a sweep as it stops a run: the running jobs stop after their current round with a
    checkpoint and `status: interrupted`, and the jobs not yet begun do not begin. The signal may reach the whole
    process group (a terminal's Ctrl-C) or this process alone; either way this process passes SIGTERM on to the
    jobs running in joblib's workers, and no process raises a KeyboardInterrupt that would make joblib kill its
    workers mid-write: with joblib, this process blocks the signals and takes them in a thread, and the workers
    it starts inherit the block, so that one waiting for a job ignores them (a job unblocks them while it runs).
    With the basic launcher the jobs run in this process, whose round loop takes the signal."""

    def __init__(self) -> None:
        self.ledger: Path | None = None
        self.stopped = False
        self.previous: dict[int, object] = {}
        self.lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {}  # sent to the workers with the jobs: they keep no state of the sweep's process

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    @staticmethod
    def stopping() -> bool:
        """Whether the sweep this job belongs to was stopped (the job should not begin)."""
        ledger = os.environ.get(LEDGER_ENV)
        return bool(ledger) and (Path(ledger) / "stop").exists()

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.ledger = Path(config.hydra.sweep.dir) / LEDGER / f"{os.getpid()}"
        shutil.rmtree(self.ledger, ignore_errors=True)  # a killed sweep's, whose process id this one has now
        self.ledger.mkdir(parents=True)
        os.environ[LEDGER_ENV] = str(self.ledger)
        launcher = str(config.hydra.launcher.get("_target_", ""))
        if threading.current_thread() is not threading.main_thread() or not ("BasicLauncher" in launcher or
                                                                              "joblib" in launcher.lower()):
            return  # jobs elsewhere (Slurm): Ctrl-C leaves this process as it always did
        for sig in STOP_SIGNALS:  # also for a thread started before the block below, which may get the signal
            self.previous[sig] = signal.signal(sig, self._stop)
        if "joblib" in launcher.lower():  # jobs in worker processes of this machine
            # multiprocessing's resource tracker unblocks the signals when it starts: start it first
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # until this process ends
            threading.Thread(target=self._take_signals, name="sweep-signals", daemon=True).start()

    def _take_signals(self) -> None:
        while True:
            self._stop(signal.sigwait(STOP_SIGNALS), None)

    def _stop(self, signum, frame) -> None:
        interrupts.request_stop()  # a job of this process still loading its data stops after one round
        with self.lock:  # the handler and the thread taking the signals
            if self.stopped:
                return
            self.stopped = True
        (self.ledger / "stop").touch()
        log.warning("%s received: stopping the sweep; its running jobs stop after their current round, the others "
                    "do not begin", signal.Signals(signum).name)
        host = socket.gethostname()
        for running in self.ledger.glob("*.running"):
            pid, _, where = running.read_text().strip().partition(" ")
            if where == host and int(pid) != os.getpid():
                try:
                    os.kill(int(pid), signal.SIGTERM)  # stops after its round, like the SIGINT it may have had
                except ProcessLookupError:
                    pass

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        ledger = os.environ.get(LEDGER_ENV)
        if not ledger or not Path(ledger).is_dir():
            return
        interrupts.clear_stop_request()  # one left by the previous job of this process
        if Path(ledger).name != str(os.getpid()) and threading.current_thread() is threading.main_thread():
            # a worker process: a signal while the job loads its data is a stop request, not a KeyboardInterrupt
            for sig in STOP_SIGNALS:
                signal.signal(sig, interrupts.request_stop)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked while the worker waited
        # where the sweep's process sends SIGTERM if it is stopped (after the handlers above are in place)
        (Path(ledger) / f"{config.hydra.job.num}.running").write_text(f"{os.getpid()} {socket.gethostname()}\n")

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        ledger = os.environ.get(LEDGER_ENV)
        if not ledger or not Path(ledger).is_dir():
            return
        outcome = job_return._return_value
        if job_return.status != JobStatus.COMPLETED or not isinstance(outcome, dict):
            outcome = {"status": "failed", "error": f"{type(outcome).__name__}: {outcome}"}
        write_json(Path(ledger) / f"{config.hydra.job.num}.json",  # resume: whether a re-launch continues it as it is
                   {"folder": str(config.hydra.runtime.output_dir), "resume": config.get("resume") is True, **outcome})
        (Path(ledger) / f"{config.hydra.job.num}.running").unlink(missing_ok=True)
        if Path(ledger).name == str(os.getpid()):
            if outcome["status"] == "interrupted":  # this process had the signal, which the job's loop took
                self._stop_quietly(Path(ledger))
        elif threading.current_thread() is threading.main_thread():
            # an idle worker ignores Ctrl-C (raised while it waits, it would break joblib's pool: the sweep's
            # process stops the sweep) and a SIGTERM sent while its job was ending
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

    def _stop_quietly(self, ledger: Path) -> None:
        self.stopped = True
        (ledger / "stop").touch()

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        sweep = Path(config.hydra.sweep.dir)
        ledger = Path(os.environ.pop(LEDGER_ENV, sweep / LEDGER / f"{os.getpid()}"))
        jobs = [json.loads(p.read_text()) for p in sorted(ledger.glob("*.json"), key=lambda p: int(p.stem))]
        shutil.rmtree(ledger, ignore_errors=True)
        try:
            ledger.parent.rmdir()  # the ledgers' folder, unless another sweep into this folder runs now
        except OSError:
            pass
        counts = Counter(job["status"] for job in jobs)
        log.info("sweep %s: %s", sweep, ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no runs")
        failed = [job for job in jobs if job["status"] == "failed"]
        by_error: dict[str, list[str]] = {}  # the jobs that failed alike (the data missing for all) said at once
        for job in failed:
            by_error.setdefault((str(job.get("error", "")).splitlines() or [""])[0][:600], []).append(job["folder"])
        for error, folders in by_error.items():
            if len(folders) == 1:
                log.error("failed: %s", error if error.startswith(folders[0]) else f"{folders[0]}: {error}")
            elif error in _said:  # a line of this process said it during the sweep
                log.error("failed: %d jobs (%s) with the error above", len(folders), listed(folders))
            else:
                log.error("failed: %d jobs (%s): %s", len(folders), listed(folders), error)
        # resume=true finds another configuration's run in a job's folder: the sweep's values differ from the first
        # launch's, and Hydra numbers the folders in the order of the values
        numbered = str(config.hydra.sweep._get_node("subdir")._value()) == "${hydra.job.num}"  # Hydra's default
        if numbered and config.get("resume") is True and any(job.get("folder_held") for job in failed):
            log.error("a sweep numbers its jobs' folders in the order of its values, so one re-launched with other "
                      "values meets other runs there: use another hydra.sweep.dir, or name the folders by their "
                      "values with hydra.sweep.subdir='${hydra.job.override_dirname}'")
        if self.stopped or counts["interrupted"] or counts["not started"]:
            left = counts["interrupted"] + counts["not started"]
            if jobs and all(job.get("resume") for job in jobs):
                # the sweeper gave every job resume=true (fedagg.compare, which refuses a user's): asking for it
                # again would be refused; the folder may be a timestamp the same command would not find again
                log.warning("stopped: %d job(s) interrupted or not started; the same command with hydra.sweep.dir=%s "
                            "continues from there", left, sweep)
            else:
                log.warning("stopped: the same command with resume=true finishes the %d interrupted and not started "
                            "job(s)", left)
            sys.exit(130)  # the shell's code for an interrupt
        if failed:
            sys.exit(1)
