"""The process that draws partition.png (`partition_picture.py`), seen from the process that asks for pictures.

One drawing process per fedagg process, asked in order and answering in order. It imports nothing of fedagg nor
torch, and neither does this module, so `python -m fedagg.run` starts it before it imports torch: matplotlib's
import (most of a second) happens beside torch's, on another core, not after it.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("fedagg.data.partition_report")  # the name its warnings always had
_PICTURE = Path(__file__).with_name("partition_picture.py")


def start_drawing() -> None:
    """Start the drawing process now, so it has imported matplotlib by the time a run's split is known (a run's
    command line calls this before composing its config). Not asked for anything, it is stopped at exit."""
    if not _painter._running():
        _painter._start()


def ask(json_path: Path, png: Path, digest: str, title: str | None = None) -> None:
    """Have `png` drawn from the split in `json_path` (`digest`: the split's and the title's, to copy a picture drawn
    before; `title`: what partition it shows)."""
    _painter.ask(json_path, png, digest, title)


def drawn(path: str | Path | None = None) -> None:
    """Wait until the picture at `path` (every picture asked for, when None) is on disk, or has failed."""
    _painter.wait(None if path is None else Path(path))


class _Painter:
    """The drawing process of this process: asked in order, answering in order."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.owner = 0  # the pid that started it: a forked child starts its own
        self.asked: list[Path] = []  # pictures asked for and not yet answered, in order
        self.first: dict[str, Path] = {}  # a split's digest -> its first picture in this process
        self.used = False  # the running process was asked for a picture

    def ask(self, json_path: Path, png: Path, digest: str, title: str | None = None) -> None:
        if not self._running() and not self._start():
            return
        copy_from = self.first.setdefault(digest, png)
        request = {"json": str(json_path), "png": str(png), "copy_from": None if copy_from == png else str(copy_from),
                   "title": title}
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except OSError as err:
            log.warning("partition.png was not drawn: the drawing process stopped (%s)", err)
            return
        self.asked.append(png)
        self.used = True

    def wait(self, path: Path | None) -> None:
        while self.asked and (path is None or path in self.asked):
            line = self.process.stdout.readline() if self.process is not None else ""
            if not line:
                log.warning("partition.png was not drawn in %s: the drawing process ended",
                            ", ".join(str(p.parent) for p in self.asked))
                self.asked.clear()
                return
            reply = json.loads(line)
            self.asked.remove(Path(reply["png"]))
            if "error" in reply:
                log.warning("partition.png was not drawn: %s", reply["error"])
            else:
                log.debug("%s %s", reply["png"], reply["how"])

    def close(self) -> None:
        """At the interpreter's exit: every picture asked for is on disk before the process ends; a drawing process
        never asked for a picture (a command line refused, a completed run skipped) is stopped, not waited for."""
        if not self._running():
            return
        if not self.used:
            self.process.kill()
        self.wait(None)
        self.process.stdin.close()
        self.process.wait()
        self.process.stdout.close()

    def _running(self) -> bool:
        return self.process is not None and self.owner == os.getpid() and self.process.poll() is None

    def _start(self) -> bool:
        if self.owner == os.getpid():
            self.wait(None)  # a process that ended: say which pictures it left undrawn
        self.asked.clear()  # a forked child's copy: its parent's process answers its parent
        try:  # -P: the script's folder is not put on sys.path (its files would shadow what matplotlib imports)
            self.process = subprocess.Popen([sys.executable, "-P", str(_PICTURE)], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, text=True)
        except OSError as err:
            log.warning("partition.png is not drawn: no drawing process (%s)", err)
            self.process = None
            return False
        self.owner, self.used = os.getpid(), False
        return True


_painter = _Painter()
atexit.register(_painter.close)
