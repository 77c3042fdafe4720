"""Checkpoints: everything a run needs to continue exactly where it stopped.

Written atomically (temp file, then rename), so a kill during the write leaves the
previous checkpoint intact; the one before is kept as `checkpoint.prev.pt` until the new
one is complete, so a checkpoint damaged afterwards (a full disk, a copy cut short) still
leaves one to resume from. The random streams need no saving beyond torch's global
generator: every other stream is derived from (seed, round, client) when it is used.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

CHECKPOINT, PREVIOUS = "checkpoint.pt", "checkpoint.prev.pt"
log = logging.getLogger(__name__)


def rng_state() -> dict:
    """torch's global generators, for a user's code that draws from them outside training (fedagg's own streams never
    do, and the engines seed them for local training: fedagg.seeding.global_rng): the CPU's and the current
    GPU's only, so a run resumes on a machine with fewer GPUs."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda_current"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"].cpu())
    if "cuda_current" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_current"].cpu())


def save_atomically(obj, path: Path) -> None:
    """torch.save via a temp file and a rename: readers never see half a file."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def save_checkpoint(run_dir: Path, state: dict) -> Path:
    path = Path(run_dir) / CHECKPOINT
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    if path.exists():  # the current one becomes the previous by a hard link: checkpoint.pt never goes missing
        link = path.with_name(PREVIOUS + ".tmp")
        link.unlink(missing_ok=True)
        os.link(path, link)
        os.replace(link, path.with_name(PREVIOUS))
    os.replace(tmp, path)
    return path


def _load(path: Path, device: torch.device) -> dict:
    return torch.load(path, map_location=device, weights_only=False)


def load_checkpoint(run_dir: Path, device: torch.device) -> dict | None:
    """The latest readable checkpoint (None when there is none); a damaged one is named in one line."""
    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        return None
    try:
        return _load(path, device)
    except Exception as err:  # noqa: BLE001 - whatever a damaged file raises, say which file it is
        damage = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'unreadable'}"
    previous = path.with_name(PREVIOUS)
    if previous.exists():
        try:
            state = _load(previous, device)
        except Exception:  # noqa: BLE001
            state = None
        if state is not None:
            log.warning("%s is damaged (%s); resuming from %s (after round %d) instead", path, damage, previous.name,
                        state["round"])
            return state
    raise ValueError(f"{path} is damaged ({damage}) and there is no earlier checkpoint to resume from; "
                     "start the run again with resume=false in a new hydra.run.dir")
