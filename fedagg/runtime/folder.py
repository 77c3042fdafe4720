"""One run per folder: a lock on the run folder for the run's lifetime.

The lock is an exclusive `flock` on the folder itself, so the kernel drops it when the
holder exits, however it exits; a second run in the same folder is refused at once,
naming the folder and the holder's process id (kept in `.owner`). An `.owner` file whose
process is gone was left by a run that was killed: it is taken over with a notice.

A folder that holds an earlier run's results is the user's: `held_run` says what is there,
so that a new run is refused before it writes anything, and `clear_run` removes all of it
when the user asks for that run to be replaced (never some files: an old
`checkpoint.prev.pt` beside a new run's `checkpoint.pt` would resume the wrong run).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)
OWNER = ".owner"
# what a run writes (Hydra's own log and .hydra/ are not results: every launch writes them)
RUN_FILES = ("summary.json", "metrics.csv", "weights.csv", "clients.csv", "checkpoint.pt", "checkpoint.prev.pt",
             "model.pt", "config.yaml", "partition.json", "partition.png", "wandb", "client_state")


def _summary(path: Path) -> dict | None:
    try:
        summary = json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


# what a run writes only once a round is done; the rest (config.yaml, partition.*, the initial model.pt, a failure's
# summary) a run may leave before its first round, when it has computed nothing
ROUND_FILES = ("metrics.csv", "weights.csv", "clients.csv", "checkpoint.pt", "checkpoint.prev.pt")


def held_run(path: Path) -> str | None:
    """The earlier run the folder holds, in words ("a completed run (seed=0, 2 rounds)"), or None when there is
    nothing a run computed: no result file, or only what a run left that never completed its first round (its
    error is all it has to say, and the next attempt replaces those files with its own; `clear_run`)."""
    path = Path(path)
    present = [name for name in RUN_FILES if (path / name).exists()]
    summary = _summary(path)
    rounds = summary.get("rounds_completed") if summary is not None else None
    if not rounds and not any(name in ROUND_FILES for name in present):
        return None
    if summary is not None and "rounds_completed" in summary:
        n = summary["rounds_completed"]
        status = summary.get("status")
        article = "an" if str(status)[:1] in tuple("aeiou") else "a"  # an interrupted run
        return f"{article} {status} run (seed={summary.get('seed')}, {n} round{'' if n == 1 else 's'})"
    return f"the files of a run that did not finish ({', '.join(present)})"


def held_sweep(path: Path) -> str | None:
    """The runs the folder holds below its top, in words ("a sweep: 3 runs in its subfolders, e.g. 0"), or None.
    A run written at the top of such a folder (a sweep's) would hide them from the tables and reports that read
    it. Two levels down, where Hydra's sweeps put their jobs (a run's own client_state is not searched)."""
    path = Path(path)
    if not path.is_dir():
        return None
    runs = sorted({p.parent for pattern in ("*/summary.json", "*/*/summary.json") for p in path.glob(pattern)})
    sweep = (path / "multirun.yaml").exists()
    if not runs:
        return "a sweep (its multirun.yaml)" if sweep else None
    where = f"{len(runs)} run{'' if len(runs) == 1 else 's'} in its subfolders, e.g. {runs[0].relative_to(path)}"
    return f"a sweep: {where}" if sweep else where


def clear_run(path: Path) -> None:
    """Remove every file a run writes (and their unfinished temp files), so that a new run starts from nothing."""
    for name in RUN_FILES:
        target = Path(path) / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
        target.with_name(name + ".tmp").unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunFolder:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.fd: int | None = None

    def acquire(self) -> "RunFolder":
        """Create the folder if needed and hold its lock; ValueError (one line) when another run has it or it
        cannot be written."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ValueError(f"cannot create the run folder {self.path} ({err.strerror}); use a writable hydra.run.dir") from None
        self.fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            self.fd = None
            holder = self._owner()
            who = f"process {holder}" if holder else "another process"
            raise ValueError(f"{self.path} is in use by another run ({who}); wait for it to finish or use another "
                             "hydra.run.dir") from None
        # root passes os.access everywhere; a folder without any write bit is meant to be read-only
        if not os.access(self.path, os.W_OK) or not self.path.stat().st_mode & 0o222:
            self.release()
            raise ValueError(f"cannot write to the run folder {self.path} (it is read-only); use a writable "
                             "hydra.run.dir")
        stale = self._owner()
        if stale and stale != os.getpid() and not _alive(stale):
            log.info("taking over %s from process %d, which has gone (a run that was killed)", self.path, stale)
        try:
            (self.path / OWNER).write_text(f"{os.getpid()}\n")
        except OSError as err:
            self.release()
            raise ValueError(f"cannot write to the run folder {self.path} ({err.strerror}); use a writable "
                             "hydra.run.dir") from None
        return self

    def _owner(self) -> int | None:
        try:
            return int((self.path / OWNER).read_text().strip())
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        if self.fd is None:
            return
        if self._owner() == os.getpid():
            try:
                (self.path / OWNER).unlink()
            except OSError:
                pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None
