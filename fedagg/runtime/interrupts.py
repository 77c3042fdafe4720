"""Ctrl-C and SIGTERM ask the round loop to stop after the current round.

The loop then writes a checkpoint and a summary with `status: interrupted`. A second
Ctrl-C stops at once (losing only the rounds since the last checkpoint), as a user who
presses it twice expects, but never in the middle of writing a checkpoint or a summary:
it waits for the write to end, so no half-written file (`checkpoint.pt.tmp`) is left.

A sweep's job may be asked to stop before its round loop starts (while it loads its
data): `request_stop` records that, and the loop then stops after its first round.

Several loops run in step (a stacked sweep's group, `fedagg.loop.drivers.run_in_step`) obey one
`StopRequests` whose signals their launcher takes: it sets `requested`, and calls `now()` on a
second Ctrl-C.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading

log = logging.getLogger(__name__)
_requested_before = False


class StoppedNow(KeyboardInterrupt):
    """A second Ctrl-C stopped the run at once; the round loop has said so in one line."""


def request_stop(signum: int | None = None, frame=None) -> None:
    """Ask the next round loop of this process to stop after one round (also a signal handler)."""
    global _requested_before
    _requested_before = True


def clear_stop_request() -> None:
    global _requested_before
    _requested_before = False


class StopRequests:
    """Context manager: `requested` turns true on the first SIGINT or SIGTERM."""

    def __init__(self) -> None:
        self.requested = False
        self.at_once = False  # a second Ctrl-C came
        self._previous: dict[int, object] = {}
        self._writing = 0  # depth of the writes a second Ctrl-C waits for
        self._stop_now = False

    def _handle(self, signum, frame) -> None:
        if self.requested and signum == signal.SIGINT:
            self.now()
            return
        if not self.requested:  # a sweep's parent forwards SIGTERM after the group's SIGINT: one line
            # only a SIGINT stops at once (a second SIGTERM is that forwarded one): say how to send it
            now = "Ctrl-C again" if signum == signal.SIGINT else f"Ctrl-C or kill -INT {os.getpid()}"
            log.warning("%s received: stopping after this round (%s to stop now)", signal.Signals(signum).name, now)
        self.requested = True

    def now(self) -> None:
        """Stop at once (a second Ctrl-C): KeyboardInterrupt here, or, while a file is written, right after it."""
        self.requested = self.at_once = True
        if self._writing:
            self._stop_now = True  # raised when the write is complete
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def writing(self, last: bool = False):
        """A file write that a second Ctrl-C does not cut: it stops the run right after the write (unless it is
        the `last`, after which there is nothing left to stop)."""
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1
            if not self._writing and self._stop_now:
                self._stop_now = False
                if not last:
                    raise KeyboardInterrupt

    def __enter__(self) -> "StopRequests":
        global _requested_before
        self.requested, _requested_before = _requested_before, False
        if threading.current_thread() is threading.main_thread():  # signals can only be caught there
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
