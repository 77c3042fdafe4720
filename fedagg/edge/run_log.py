"""The run's log file (`<run dir>/run.log`), opened only once the run knows the folder is its own.

Hydra sets up a job's log file before the job starts. A plain file handler would then append a
refused run's lines (its folder holds another run, or a resume that does not match) to the folder
the refusal says it left unchanged, and a run that replaces an earlier one (overwrite=true) would
go on writing that run's log. `RunLog` (conf/hydra/job_logging/fedagg.yaml) holds the lines until
the run claims the folder: a new or replacing run starts the file anew, a resumed run appends to
it, and a refused run never opens it (its lines still reach the console).
"""

from __future__ import annotations

import logging
import weakref
from pathlib import Path

_handlers: weakref.WeakSet = weakref.WeakSet()


class RunLog(logging.Handler):
    def __init__(self, filename: str, encoding: str = "utf-8") -> None:
        super().__init__()
        self.path, self.encoding = Path(filename), encoding
        self.held: list[logging.LogRecord] | None = []  # None once the file is open, or the handler closed
        self.stream = None
        _handlers.add(self)

    def emit(self, record: logging.LogRecord) -> None:  # under self.lock (logging.Handler.handle)
        if self.stream is not None:
            self._write(record)
        elif self.held is not None:
            self.held.append(record)

    def _write(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(self.format(record) + "\n")
            self.stream.flush()
        except Exception:  # noqa: BLE001 - logging must never stop the run (logging's own convention)
            self.handleError(record)

    def claim(self, fresh: bool) -> None:
        """Open the file (`fresh`: anew, else to append) and write the lines held so far."""
        with self.lock:
            if self.stream is not None or self.held is None:
                return
            self.stream = open(self.path, "w" if fresh else "a", encoding=self.encoding)
            held, self.held = self.held, None
            for record in held:
                self._write(record)

    def close(self) -> None:
        with self.lock:
            if self.stream is not None:
                self.stream.close()
                self.stream = None
            self.held = None
        super().close()


def claim(run_dir: str | Path, fresh: bool) -> None:
    """The run owns `run_dir` from now on: its log file there opens (`fresh`: started anew) with the lines so far."""
    run_dir = Path(run_dir).resolve()
    for handler in list(_handlers):
        if handler.path.parent.resolve() == run_dir:
            handler.claim(fresh)
