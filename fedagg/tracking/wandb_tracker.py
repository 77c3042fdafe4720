"""Weights & Biases: the same per-round metrics, the resolved config and the partition picture.

`mode: offline` needs no network or key and leaves `wandb/offline-run-*` in the run
directory for a later `wandb sync`. A tracker that cannot start warns and the run goes on
with its result files only: a run must not die for its dashboard.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Literal

from fedagg.config.constraints import checked
from fedagg.tracking.base import Tracker

log = logging.getLogger(__name__)


class WandbTracker(Tracker):
    @checked("logger.")
    def __init__(
        self,
        project: str = "fedagg",
        entity: str | None = None,
        mode: Literal["online", "offline", "disabled"] = "offline",
        group: str | None = None,
        tags: list[str] | None = None,
        name: str | None = None,
    ) -> None:
        self.project, self.entity, self.mode = project, entity, mode
        self.group, self.tags, self.name = group, list(tags or []), name
        self.run = None

    def start(self, run_dir: Path, config: dict, name: str) -> None:
        try:
            import wandb

            self.run = wandb.init(
                project=self.project,
                entity=self.entity,
                mode=self.mode,
                group=self.group,
                tags=self.tags,
                name=self.name or name,
                dir=str(run_dir),
                config=config,
                reinit="create_new",  # the jobs of a stacked sweep each have a run, open at once in one process
            )
        except Exception as err:  # noqa: BLE001 - any failure to start means: carry on without it
            warnings.warn(f"W&B could not start ({err}); continuing with the CSV and JSON files only", stacklevel=2)
            self.run = None

    def log_round(self, round: int, metrics: dict) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in metrics.items() if v is not None}, step=round)

    def log_image(self, key: str, path: Path) -> None:
        if self.run is not None:
            import wandb

            from fedagg.data.partition_report import drawn

            drawn(path)  # a picture may still be being drawn in the background
            self.run.log({key: wandb.Image(str(path))}, step=0)

    def finish(self, summary: dict) -> None:
        if self.run is None:
            return
        for key in ("status", "final_test_acc", "best_test_acc", "rounds_completed", "rounds_to_target", "wall_time_s"):
            self.run.summary[key] = summary.get(key)
        self.run.finish()
        self.run = None
