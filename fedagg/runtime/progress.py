"""Progress of the round loop: a live bar on a terminal, plain log lines elsewhere.

A tqdm bar redraws itself with carriage returns; in a file (nohup, Slurm, a joblib
worker's log) that becomes one unreadable line, so off a terminal the same figures are
logged as ordinary lines, at most one every `log_interval_s` seconds, plus the last round.
Round loops run in step (the runs of a stacked sweep, `fedagg.loop.drivers.run_in_step`) log
lines too (`bar=False`): a bar each would stack up one terminal line per run (64 for a 64-job
group); their group draws one bar of the rounds it trains (`GroupProgress`).
"""

from __future__ import annotations

import logging
import sys
import time

from tqdm.auto import tqdm

log = logging.getLogger("fedagg")


class RoundProgress:
    def __init__(self, first: int, total: int, log_interval_s: float = 30.0, stream=None, bar: bool = True) -> None:
        stream = sys.stderr if stream is None else stream
        self.total, self.interval = total, log_interval_s
        self.bar = tqdm(total=total, initial=first - 1, desc="rounds", unit="round", dynamic_ncols=True,
                        mininterval=1.0, file=stream, disable=not (bar and _is_terminal(stream)))
        self.started, self.first, self.last_logged = time.perf_counter(), first, float("-inf")
        self.figures: dict[str, str] = {}

    def update(self, r: int, test_acc: float | None, train_loss: float | None) -> None:
        if test_acc is not None:
            self.figures["acc"] = f"{test_acc:.4f}"
        if train_loss is not None:  # None: no client reported this round
            self.figures["loss"] = f"{train_loss:.4f}"
        if not self.bar.disable:
            self.bar.set_postfix(self.figures, refresh=False)
            self.bar.update(1)
            return
        now = time.perf_counter()
        if now - self.last_logged >= self.interval or r == self.total:
            self.last_logged = now
            per_round = (now - self.started) / (r - self.first + 1)
            eta = per_round * (self.total - r)
            shown = " ".join(f"{k}={v}" for k, v in self.figures.items())
            log.info("round %d/%d %s (%.1f s/round, %s left)", r, self.total, shown, per_round, _duration(eta))

    def close(self) -> None:
        self.bar.close()


class GroupProgress:
    """On a terminal, one bar for a stacked group: the rounds it has trained and the runs still in it."""

    def __init__(self, stream=None) -> None:
        stream = sys.stderr if stream is None else stream
        self.bar = tqdm(desc="stacked rounds", unit="round", dynamic_ncols=True, mininterval=1.0, file=stream,
                        disable=not _is_terminal(stream))

    def update(self, runs: int) -> None:
        self.bar.set_postfix(runs=runs, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _duration(seconds: float) -> str:
    minutes, s = divmod(int(round(seconds)), 60)
    h, m = divmod(minutes, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
