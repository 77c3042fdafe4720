"""Checkpoints: everything a run needs to continue exactly where it stopped.

Written atomically (temp file, then rename), so a kill during the write leaves the
previous checkpoint intact. The random streams need no saving beyond torch's global
generator: every other stream is derived from (seed, round, client) when it is used.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

CHECKPOINT = "checkpoint.pt"


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([t.cpu() for t in state["cuda"]])


def save_checkpoint(run_dir: Path, state: dict) -> Path:
    path = Path(run_dir) / CHECKPOINT
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(run_dir: Path, device: torch.device) -> dict | None:
    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        return None
    return torch.load(path, map_location=device, weights_only=False)
