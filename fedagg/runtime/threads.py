"""How many threads torch computes with (`threads`: auto or a number).

torch uses every core by default, and two processes that each do so on the same cores
wait for each other's threads: a run beside another busy process slows down several
times, worst beside a second fedagg run (a sweep run n jobs at a time is exactly that).
`threads: auto` therefore gives each job the cores it may use divided by the jobs that a
launcher runs at once on this machine, and a small model one thread: its per-operation
work is too small to share, so one thread is as fast as two on an idle machine and
several times faster on a busy one. A number
given as `threads` wins; so does OMP_NUM_THREADS when the user set it.
"""

from __future__ import annotations

import logging
import os

import torch

SMALL_MODEL = 200_000  # parameters; the MNIST MLPs are under it (README "On a busy CPU": measured on the digits MLP)
log = logging.getLogger("fedagg")


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what this process may use (a Slurm allocation, taskset)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def choose(setting, num_params: int, concurrent_jobs: int, environ=os.environ) -> tuple[int | None, str]:
    """(threads to use, or None to leave torch's choice; why, for the log)."""
    if setting != "auto":
        if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
            raise ValueError(f"threads={setting!r} is not allowed; use auto or a number of threads >= 1")
        return setting, "threads given"
    if environ.get("OMP_NUM_THREADS"):
        return None, f"OMP_NUM_THREADS={environ['OMP_NUM_THREADS']} from the environment"
    cores = available_cores()
    share = max(1, cores // max(1, concurrent_jobs))
    if num_params < SMALL_MODEL:
        return 1, f"auto: a small model ({num_params:,} parameters) is fastest on one thread"
    return share, f"auto: {cores} core(s) for {concurrent_jobs} job(s) at once"


def apply(setting, num_params: int, concurrent_jobs: int = 1) -> int:
    threads, why = choose(setting, num_params, concurrent_jobs)
    if threads is not None:
        torch.set_num_threads(threads)
    log.info("computing with %d torch thread(s) (%s)", torch.get_num_threads(), why)
    return torch.get_num_threads()
