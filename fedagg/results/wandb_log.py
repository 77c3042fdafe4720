"""Results to Weights & Biases: a plot or report run beside the runs that logged there (logger=wandb).

Only when the runs' own config chose W&B; offline by default (their mode), so that nothing
leaves the machine unless the runs were online. Failure to log never loses a file already
written.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from fedagg.results.values import lookup


def log_to_wandb(runs: list[dict], out: Path, mode: str | None, job: str, payload, artifact=None) -> None:
    """Log `payload(wandb)` (a dict of W&B objects), and `artifact(wandb)` (a wandb.Artifact) when given, to a new
    W&B run of the runs' project, in their group, when they used W&B; never fail the files already written."""
    loggers = [lookup(r["summary"], "config.logger") or {} for r in runs]
    used = [lg for lg in loggers if str(lg.get("_target_", "")).endswith("WandbTracker")]
    if not used or mode == "disabled":
        return
    settings = used[0]
    groups = {lg.get("group") for lg in used}
    group = groups.pop() if len(groups) == 1 else None  # the sweep's runs share it; mixed groups: none of them
    mode = mode or settings.get("mode") or "offline"
    try:
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        run = wandb.init(project=settings.get("project") or "fedagg", entity=settings.get("entity"), mode=mode,
                         group=group, job_type=job, name=f"{job}-{out.name}", dir=str(out),
                         config={"runs": [str(r["dir"]) for r in runs]})
        items = payload(wandb)
        run.log(items)
        if artifact is not None:
            run.log_artifact(artifact(wandb))
        run.finish()
        where = f"group {group}" if group else "no group (the runs set no common logger.group)"
        print(f"logged {len(items)} {job} item(s){' and an artifact' if artifact else ''} to W&B ({mode}, "
              f"project {settings.get('project') or 'fedagg'}, {where})")
    except Exception as err:  # noqa: BLE001 - the files are written; W&B is a bonus
        warnings.warn(f"W&B logging skipped: {err}", stacklevel=2)
