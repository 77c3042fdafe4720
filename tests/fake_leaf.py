"""Tiny LEAF all_data files in the genuine JSON layout (what LEAF's preprocess.sh writes), for the
femnist and shakespeare loaders; each writer returns what a correct loader must read from them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedagg.data.leaf import VOCABULARY


def _write(folder: Path, files: list[dict[str, dict]]) -> None:
    folder.mkdir(parents=True)
    for i, users in enumerate(files):
        content = {"users": list(users), "num_samples": [len(d["y"]) for d in users.values()], "user_data": users}
        (folder / f"all_data_{i}.json").write_text(json.dumps(content))


def write_femnist(root: Path, sizes=((5, 12), (3,)), seed: int = 0) -> list[dict]:
    """Writers of the given sizes, grouped by file; pixels are multiples of 1/255 so uint8 holds them exactly.
    Returns per writer (in file order) its uint8 images [n, 1, 28, 28] and labels."""
    rng = np.random.default_rng(seed)
    files, writers = [], []
    for f, group in enumerate(sizes):
        users = {}
        for w, n in enumerate(group):
            pixels = rng.integers(0, 256, (n, 784))
            labels = rng.integers(0, 62, n)
            users[f"f{f:04d}_{w:02d}"] = {"x": (pixels / 255).tolist(), "y": labels.tolist()}
            writers.append({"x": pixels.astype(np.uint8).reshape(n, 1, 28, 28), "y": labels})
        files.append(users)
    _write(root / "femnist" / "all_data", files)
    return writers


def write_shakespeare(root: Path, sizes=(6, 11, 4), seed: int = 0) -> list[np.ndarray]:
    """Roles with the given numbers of samples, each cut from one running text as LEAF's sliding windows are;
    returns per role its samples as 81 token ids (the 80 read, then the next)."""
    rng = np.random.default_rng(seed)
    users, roles = {}, []
    for r, n in enumerate(sizes):
        text = "".join(VOCABULARY[i] for i in rng.integers(0, len(VOCABULARY), n + 80))
        users[f"PLAY_ROLE{r}"] = {"x": [text[i:i + 80] for i in range(n)], "y": [text[i + 80] for i in range(n)]}
        roles.append(np.array([[VOCABULARY.index(c) for c in text[i:i + 81]] for i in range(n)], dtype=np.uint8))
    _write(root / "shakespeare" / "all_data", [users])
    return roles
