"""The live-tracker interface; this base logs nothing (`logger=csv`: files only)."""

from __future__ import annotations

from pathlib import Path


class Tracker:
    def start(self, run_dir: Path, config: dict, name: str) -> None:
        pass

    def log_round(self, round: int, metrics: dict) -> None:
        pass

    def log_image(self, key: str, path: Path) -> None:
        pass

    def finish(self, summary: dict) -> None:
        pass
