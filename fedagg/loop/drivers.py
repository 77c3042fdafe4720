"""Drivers: who calls a round loop's two phases, and who trains the jobs between them.

`run_alone(loop)` is a single run: each round `begin`, the run's own engine trains the job, `end`.
`run_in_step(loops, engine, stop)` runs several loops in one thread, round by round: `begin` on every loop
still running, one `train_rounds` call of the (parallel) engine for all their jobs, `end` on each. A loop that
ends (its last round, diverged, failed, stopped) leaves; the others go on. It is the stacked launcher's driver
(hydra_plugins/fedagg_stacked_launcher): a sweep's runs of one model structure share the device that way,
each still its own run (its folder, files, checkpoints, resume). `run_async(loop, C)` (fedagg.loop.asynchronous)
drives one loop on the asynchronous server: an event queue of arrivals on the simulated clock.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable, ContextManager

from fedagg.engines.base import RoundJob, RoundResult
from fedagg.engines.parallel import ParallelEngine
from fedagg.loop.round_loop import RoundLoop
from fedagg.runtime.interrupts import StoppedNow, StopRequests
from fedagg.runtime.progress import GroupProgress, RoundProgress

log = logging.getLogger("fedagg")
Outcome = dict | BaseException  # a loop's summary, or what ended it: an error, StoppedNow (a second Ctrl-C)


def run_alone(loop: RoundLoop) -> dict:
    """The run's remaining rounds on its own engine; its summary. A second Ctrl-C raises StoppedNow once the
    folder says how far the run got; an error is raised after summary.json records it."""
    def one_round() -> None:
        plan = loop.begin(loop.next_round)
        loop.end(plan, None if plan.job is None else loop.fed.engine.train_round(plan.job))

    return drive(loop, one_round)


def drive(loop: RoundLoop, step: Callable[[], None]) -> dict:
    """Call `step` while the loop runs (a round; on the asynchronous server an event); the loop's summary. What a
    driver of one loop shares: the stop requests, the progress bar, a failure or a second Ctrl-C recorded."""
    # the handlers stay until the last file is written: a second Ctrl-C waits for a write to end
    with StopRequests() as stop:
        loop.start(stop, RoundProgress(loop.next_round, loop.settings.rounds))
        try:
            while loop.running:
                step()
        except KeyboardInterrupt:
            loop.stopped_at_once()
            raise StoppedNow from None
        except Exception as err:
            loop.failed(err)
            raise
        finally:
            loop.progress.close()
        return loop.complete()


def run_in_step(loops: list[RoundLoop], engine: ParallelEngine, stop: StopRequests,
                focus: Callable[[RoundLoop], ContextManager] = lambda loop: contextlib.nullcontext(),
                left: Callable[[int, Outcome], None] = lambda k, outcome: None) -> list[Outcome]:
    """Run `loops` round by round together, their jobs trained by `engine.train_rounds` (a `ParallelEngine`);
    each loop's outcome, in their order. `stop`: the requests every loop obeys (the caller takes the signals: a
    first Ctrl-C sets `requested`, a second raises KeyboardInterrupt here, or sets `at_once` while a file is
    written); `focus(loop)`: entered around whatever is done for one loop (its log lines go to its file);
    `left(k, outcome)`: called as loop k leaves, while the others go on."""
    outcomes: dict[int, Outcome] = {}
    live = list(range(len(loops)))
    group = GroupProgress()
    clocks = [JobClock() for _ in loops]

    @contextlib.contextmanager
    def on(k: int):  # work for loop k alone: its log lines, its seconds
        with focus(loops[k]), clocks[k].running():
            yield

    def leave(k: int, outcome: Outcome) -> None:
        with stop.writing(last=True):  # a second Ctrl-C meanwhile stops the others at the next round
            outcomes[k] = outcome
            live.remove(k)
            loops[k].progress.close()
            left(k, outcome)

    def failed(k: int, err: Exception) -> None:  # in its `except` clause: summary.json gets the traceback
        with on(k):
            loops[k].failed(err)
        leave(k, err)

    started_at = round(time.time(), 3)
    for loop, clock in zip(loops, clocks):  # a bar each would stack a terminal line per run: the group draws one
        loop.start(stop, RoundProgress(loop.next_round, loop.settings.rounds, bar=False), clock)
        loop.summary["group_started_at"] = started_at  # fedagg.results.timing counts the group's time once
    try:
        for k in [k for k in live if not loops[k].running]:  # resumed after its last round
            with on(k):
                leave(k, loops[k].complete())
        while live:
            if stop.at_once:  # asked while a file was written
                raise KeyboardInterrupt
            plans = {}
            for k in list(live):
                try:
                    with on(k):
                        plans[k] = plan = loops[k].begin(loops[k].next_round)
                        own = loops[k].fed.engine
                        if plan.job is not None and own is not engine and isinstance(own, ParallelEngine):
                            own._resolve_chunk_size([plan.job], say=False)  # what the run alone cuts its blocks to
                except Exception as err:
                    failed(k, err)
            jobs = {k: plan.job for k, plan in plans.items() if plan.job is not None}
            took = time.perf_counter()
            trained = train_together(engine, jobs)
            share(time.perf_counter() - took, jobs, clocks)
            group.update(len(trained))
            for k, plan in plans.items():
                result = trained.get(k)
                try:
                    if isinstance(result, Exception):
                        raise result
                    with on(k):
                        going_on = loops[k].end(plan, result)
                        if not going_on:
                            summary = loops[k].complete()
                except Exception as err:
                    failed(k, err)
                    continue
                if not going_on:
                    leave(k, summary)
    except KeyboardInterrupt:  # a second Ctrl-C: every running loop stops at once, keeping its last checkpoint
        for k in list(live):
            with on(k):
                loops[k].stopped_at_once()
            leave(k, StoppedNow())
    finally:
        group.close()
    return [outcomes[k] for k in range(len(loops))]


class JobClock:
    """A stacked run's own seconds (its `wall_time_s`, `elapsed_s`): the time spent on it alone (`running`: its
    begin and end, i.e. sampling, aggregation, evaluation, files) plus its share of each training call it took part
    in (`share`). The group's runs' clocks together count the group's time once; what no run is charged is the
    launcher closing a run that left and the group's progress bar."""

    def __init__(self) -> None:
        self.total, self.since, self.depth = 0.0, 0.0, 0

    def __call__(self) -> float:
        return self.total + (time.perf_counter() - self.since if self.depth else 0.0)

    @contextlib.contextmanager
    def running(self):
        if not self.depth:
            self.since = time.perf_counter()
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth:
                self.total += time.perf_counter() - self.since


def share(seconds: float, jobs: dict[int, RoundJob], clocks: list[JobClock]) -> None:
    """Charge a training call's seconds to its runs by the clients each trained in it: the call's work is the
    clients' local training, which costs about the same per client for runs of one model and batch shape."""
    clients = {k: len(job.clients) for k, job in jobs.items()}
    total = sum(clients.values())
    for k, n in clients.items():
        clocks[k].total += seconds * n / total if total else seconds / len(clients)


def train_together(engine: ParallelEngine, jobs: dict[int, RoundJob]) -> dict[int, RoundResult | Exception]:
    """The round's jobs in one `train_rounds` call; when that call fails, each job alone, so that one run's error
    (its data, its objective) fails that run alone."""
    if not jobs:
        return {}
    try:
        return dict(zip(jobs, engine.train_rounds(list(jobs.values()))))
    except Exception as err:
        if len(jobs) == 1:
            return {k: err for k in jobs}
        log.warning("a stacked round of %d runs failed (%s: %s); training them one at a time this round",
                    len(jobs), type(err).__name__, err)
    out: dict[int, RoundResult | Exception] = {}
    for k, job in jobs.items():
        try:
            out[k] = engine.train_rounds([job])[0]
        except Exception as one:
            out[k] = one
    return out
