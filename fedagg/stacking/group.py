"""The group of a stacked sweep: the coordinator its runs' threads hand their rounds to."""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from dataclasses import dataclass

from fedagg.clients.trainer import LocalSGD
from fedagg.engines.base import Engine, RoundJob, RoundResult
from fedagg.engines.parallel import ParallelEngine
from fedagg.runtime import interrupts
from fedagg.runtime.progress import GroupProgress

log = logging.getLogger("fedagg")
_local = threading.local()  # the group and place of the run this thread executes


@dataclass
class _Slot:
    job: RoundJob
    result: RoundResult | None = None
    error: BaseException | None = None
    done: bool = False


class Coordinator:
    """Trains the rounds of `size` runs together: a round starts when every run still in the group has
    handed in its own, in the order of the runs (their place), whichever thread arrives last computing it."""

    def __init__(self, size: int) -> None:
        self.live = set(range(size))
        self.pending: dict[int, _Slot] = {}
        self.engine: ParallelEngine | None = None
        self.cond = threading.Condition()
        self.progress = GroupProgress()  # the runs' own loops log lines (fedagg.runtime.progress)

    def adopt(self, own: ParallelEngine) -> None:
        """The group's engine: a copy of the first run's before it trained (same options, chunk size unresolved,
        resolved for the whole group at its first round). The grouping made every run's engine options equal."""
        with self.cond:
            if self.engine is None:
                self.engine = copy.copy(own)

    def submit(self, place: int, job: RoundJob) -> RoundResult:
        with self.cond:
            slot = self.pending[place] = _Slot(job)
            self._run_if_complete()
            while not slot.done:
                if interrupts.stopping_now():  # a second Ctrl-C: the run's loop says how far it got
                    del self.pending[place]
                    raise KeyboardInterrupt
                self.cond.wait(0.2)  # in short waits: a second Ctrl-C must not wait for a run still loading
        if slot.error is not None:
            raise slot.error
        return slot.result

    def leave(self, place: int) -> None:
        with self.cond:
            if place in self.live:
                self.live.discard(place)
                self._run_if_complete()
                if not self.live:
                    self.progress.close()

    def _run_if_complete(self) -> None:
        if not self.pending or set(self.pending) != self.live:
            return
        slots = [self.pending[p] for p in sorted(self.pending)]
        self.pending = {}
        try:
            for slot, result in zip(slots, self.engine.train_rounds([s.job for s in slots], interrupts.stopping_now)):
                slot.result = result
            self.progress.update(len(slots))
        except KeyboardInterrupt:  # a second Ctrl-C stopped the round: every run stops at once
            for slot in slots:
                slot.error = KeyboardInterrupt()
        except Exception as err:
            if len(slots) == 1:
                slots[0].error = err
            else:  # one run's error (its data, its objective) fails that run alone: train them one by one
                log.warning("a stacked round of %d runs failed (%s: %s); training them one at a time this round",
                            len(slots), type(err).__name__, err)
                for slot in slots:
                    try:
                        slot.result = self.engine.train_rounds([slot.job], interrupts.stopping_now)[0]
                    except BaseException as one:  # KeyboardInterrupt too: that run stops at once
                        slot.error = one
        finally:
            for slot in slots:
                slot.done = True
                if slot.result is None and slot.error is None:
                    slot.error = RuntimeError("the stacked round was cut short")
            self.cond.notify_all()


class StackedEngine(Engine):
    """The engine a run of a stacked group sees: its rounds train in the group's computation."""

    def __init__(self, own: ParallelEngine, coordinator: Coordinator, place: int) -> None:
        self.own, self.coordinator, self.place = own, coordinator, place
        self.eval_batch_size = own.eval_batch_size

    def check(self, trainer: LocalSGD) -> None:
        self.own.check(trainer)

    @property
    def clients_in_memory(self) -> int:
        return self.own.clients_in_memory

    def train_round(self, job: RoundJob) -> RoundResult:
        self.own._resolve_chunk_size([job])  # what the run alone would cut its aggregator's temporaries to
        return self.coordinator.submit(self.place, job)


@contextlib.contextmanager
def member(coordinator: Coordinator, place: int):
    """Within: this thread executes the run at `place` of the group; at the end it leaves the group."""
    _local.member = (coordinator, place)
    try:
        yield
    finally:
        _local.member = None
        coordinator.leave(place)


def engine_for(engine: Engine) -> Engine:
    """The engine a run uses: its own, or in a stacked group's thread, a StackedEngine over it."""
    found = getattr(_local, "member", None)
    if found is None:
        return engine
    coordinator, place = found
    if not isinstance(engine, ParallelEngine):  # the launcher groups only engine=parallel runs
        coordinator.leave(place)
        return engine
    coordinator.adopt(engine)
    return StackedEngine(engine, coordinator, place)
