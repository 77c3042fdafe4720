"""Ctrl-C and SIGTERM ask the round loop to stop after the current round.

The loop then writes a checkpoint and a summary with `status: interrupted`. A second
Ctrl-C stops at once (losing only the rounds since the last checkpoint), as a user who
presses it twice expects.
"""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)


class StopRequests:
    """Context manager: `requested` turns true on the first SIGINT or SIGTERM."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("%s received: stopping after this round (Ctrl-C again to stop now)", signal.Signals(signum).name)

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():  # signals can only be caught there
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
