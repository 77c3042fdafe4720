"""A sweep's start-up said once on the console.

The lines a job logs while it is prepared (its data, model and threads, the notes on its settings) are alike for
the jobs of a sweep that differ in seeds and methods: the console shows each the first time a job of the sweep says
it, and each job's run.log keeps all of its own. `fedagg.run.prepare` marks that stretch (`preparing`), so the
filter knows a start-up line from a round's. The stacked launcher puts `SaidOnce` on its console; the basic and the
joblib launchers' sweeps get it from the Hydra callback `StartUpOnce` (conf/config.yaml), which a job's logging,
configured anew for every job, receives at the job's start. Jobs in other processes (joblib's workers) share no
memory: there each worker says the start-up once.
"""

from __future__ import annotations

import contextlib
import logging
from contextvars import ContextVar
from typing import Iterator

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

_preparing: ContextVar[bool] = ContextVar("preparing", default=False)


@contextlib.contextmanager
def preparing() -> Iterator[None]:
    """Within: the lines logged are a job's start-up."""
    token = _preparing.set(True)
    try:
        yield
    finally:
        _preparing.reset(token)


class SaidOnce(logging.Filter):
    """Lets a start-up line through the first time it is said (same logger, level and text); every other line
    passes. `preparing()` marks a stretch as start-up as well (the stacked launcher's preparation of a job)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple] = set()
        self.active = False

    @contextlib.contextmanager
    def preparing(self) -> Iterator[None]:
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not (self.active or _preparing.get()):
            return True
        key = (record.name, record.levelno, record.getMessage())
        new = key not in self.seen
        self.seen.add(key)
        return new


def console_handlers() -> list[logging.Handler]:
    """The root logger's handlers that write to a stream, not to a file (a job's run.log keeps every line)."""
    return [h for h in logging.getLogger().handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]


class StartUpOnce(Callback):
    """The Hydra callback: one `SaidOnce` for the sweep, on the console of each of its jobs."""

    def __init__(self) -> None:
        self.said = SaidOnce()

    def __getstate__(self) -> dict:
        return {}  # sent to joblib's workers with the jobs: each worker filters with its own

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.said = SaidOnce()  # a new sweep says its start-up again

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return  # a single run says everything
        for handler in console_handlers():  # Hydra configured the job's logging anew just before
            if self.said not in handler.filters:
                handler.addFilter(self.said)
