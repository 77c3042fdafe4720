"""Tiny TFF h5 files in the genuine layout (TFF's HDF5ClientData: examples/<client id>/<feature>), one train
and one test file per dataset, as TFF's fed_emnist.tar.bz2 and shakespeare.tar.bz2 hold them."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np

FEMNIST_FILES = ("fed_emnist_train.h5", "fed_emnist_test.h5")
SHAKESPEARE_FILES = ("shakespeare_train.h5", "shakespeare_test.h5")


def _write(folder: Path, names: tuple[str, str], clients: dict[str, tuple[dict, dict]]) -> None:
    import h5py

    folder.mkdir(parents=True, exist_ok=True)
    for side, name in enumerate(names):
        with h5py.File(folder / name, "w") as f:
            for cid, splits in clients.items():
                group = f.create_group(f"examples/{cid}")
                for feature, value in splits[side].items():
                    group.create_dataset(feature, data=value)


def write_femnist(folder: Path, sizes=(("f0002_07", 3, 2), ("f0001_40", 4, 1)), seed: int = 0) -> dict:
    """Writers (id, train size, test size); pixels float32 multiples of 1/255, labels int32 as TFF stores them.
    Returns per writer id its (train, test) uint8 images [n, 1, 28, 28] and labels."""
    rng = np.random.default_rng(seed)
    clients, expected = {}, {}
    for cid, *ns in sizes:
        splits, exp = [], []
        for n in ns:
            pixels = rng.integers(0, 256, (n, 28, 28))
            labels = rng.integers(0, 62, n)
            splits.append({"pixels": (pixels / 255).astype(np.float32), "label": labels.astype(np.int32)})
            exp.append((pixels.astype(np.uint8).reshape(n, 1, 28, 28), labels))
        clients[cid], expected[cid] = tuple(splits), tuple(exp)
    _write(folder, FEMNIST_FILES, clients)
    return expected


def write_shakespeare(folder: Path, roles: dict[str, tuple[list[str], list[str]]]) -> None:
    """Roles' (train snippets, test snippets), stored as TFF stores them: variable-length byte strings."""
    import h5py

    bytes_ = h5py.string_dtype(encoding="utf-8")
    clients = {cid: tuple({"snippets": np.array(snips, dtype=bytes_)} for snips in sides) for cid, sides in roles.items()}
    _write(folder, SHAKESPEARE_FILES, clients)


def archive(folder: Path, names: tuple[str, str], into: Path) -> Path:
    """The files packed loose (no folder inside), as TFF's .tar.bz2 archives are."""
    stem = "fed_emnist" if names == FEMNIST_FILES else "shakespeare"
    path = into / f"{stem}.tar.bz2"
    with tarfile.open(path, "w:bz2") as tar:
        for name in names:
            tar.add(folder / name, arcname=name)
    return path
