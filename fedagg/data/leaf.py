"""`dataset=femnist` and `dataset=shakespeare`: LEAF's federated datasets (Caldas et al. 2018), one
client per writer or speaking role, read from the JSON files LEAF's own preprocessing writes or,
when there are none, from TensorFlow Federated's h5 copies (fedagg.data.tff), downloaded when missing.

Which files: `data.root/<name>/all_data/*.json` (LEAF) when that folder holds any; otherwise
`data.root/<name>/tff/` (TFF's train and test h5 files), fetched first when they are missing and
`data.download` is on (checked against the SHA-256 TFF's loaders use, written atomically); otherwise
one error naming both folders and what to put in each.

Source: LEAF's `data/<name>/preprocess.sh` (github.com/TalwalkarLab/leaf) downloads the raw
NIST SD19 images or the Gutenberg text and writes `data/<name>/data/all_data/*.json`, every
writer's (role's) samples before any split: `{"users": [...], "user_data": {user: {"x": [...],
"y": [...]}}}`. fedagg reads those files from `data.root/<name>/all_data/` and makes the split
LEAF's `--tf` would, itself (per client, from a fixed stream, so every run sees the same test
samples): FEMNIST 90/10 at random per writer, Shakespeare 80/20 in time order per role. Why this
source first: it is the one fedagg's client counts refer to (3,597 writers, 1,129 roles), its format
needs no library beyond the standard one, and it stays reproducible from public raw data. Its
preprocessing needs network, the NIST download (about 1 GB) and LEAF's scripts, which fedagg does not
reimplement and LEAF publishes no processed copy: so the download is TFF's (3,400 writers, 715 roles,
each client's train/test split TFF's own; fedagg's design allows TFF's EMNIST-62 where that file is what is
provided). The decoded tensors are cached (keyed by the JSON files' names, sizes and times), as the JPEG
datasets are, because parsing FEMNIST's JSON takes minutes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedagg.data import tff
from fedagg.data.datasets import DatasetBundle, _not_found
from fedagg.data.files import DataError, cache_folder, data_root
from fedagg.data.image_folders import _save_atomically
from fedagg.seeding import stream_seed

log = logging.getLogger(__name__)

# LEAF's models/shakespeare/utils/language_utils.py: the 80 characters its next-character models predict
VOCABULARY = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
SEQUENCE = 80  # characters a Shakespeare sample reads before the one it predicts
FEMNIST_SIDE, FEMNIST_CLASSES = 28, 62
CACHE_VERSION = 1


def _how(name: str, folder: Path, root: str) -> str:
    return (f"run LEAF's data/{name}/preprocess.sh (github.com/TalwalkarLab/leaf, e.g. ./preprocess.sh -s niid "
            f"--sf 1.0 -k 0 -t sample) on a machine with network and copy its data/all_data/*.json into {folder}; "
            f"or {tff.how(name, root)}")


def _files(name: str, root: str, download: bool) -> tuple[str, Path, list[Path]]:
    """("leaf", folder, its JSON files) when LEAF's all_data holds any, else ("tff", folder, TFF's two h5 files),
    fetched first when `download` is on; raises naming both when neither is there."""
    folder = data_root(root) / name / "all_data"
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if files:
        return "leaf", folder, files
    how = _how(name, folder, root)
    h5 = tff.provide(name, root, download, how)
    if h5 is not None:
        return "tff", h5[0].parent, h5
    raise _not_found(name, folder, ["*.json (LEAF's all_data files)"], how,
                     "no *.json files" if folder.is_dir() else "no such folder")


def _users(name: str, files: list[Path]):
    """(user, its x list, its y list) for every user of every file, in file order then LEAF's user order."""
    for path in files:
        try:
            with open(path) as f:
                content = json.load(f)
            users, data = content["users"], content["user_data"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DataError(f"{name}: cannot read {path} as a LEAF all_data file ({type(err).__name__}: {err}); "
                            "copy it again from LEAF's data/all_data/") from None
        for user in users:
            yield user, data[user]["x"], data[user]["y"]


def _cut(n: int, train_frac: float) -> int:
    """Training samples of a client of n (>= 2): as LEAF's split_data.py, at least one on each side."""
    return 1 if n == 2 else min(max(1, int(train_frac * n)), n - 1)


def _split(name: str, per_user: list[tuple[np.ndarray, np.ndarray]], train_frac: float, in_order: bool) -> dict:
    """Each user's samples cut into its train and test split: the first part in time order, or a random one."""
    rng = np.random.default_rng(stream_seed(0, f"{name}_split"))
    parts: dict[str, list[list[np.ndarray]]] = {"train": [[], [], []], "test": [[], [], []]}
    dropped = 0
    for x, y in per_user:
        if len(y) < 2:  # nothing to test it on, or nothing to train on
            dropped += 1
            continue
        owner = len(parts["train"][2])
        order = np.arange(len(y)) if in_order else rng.permutation(len(y))
        cut = _cut(len(y), train_frac)
        for split, rows in (("train", np.sort(order[:cut])), ("test", np.sort(order[cut:]))):
            xs, ys, owners = parts[split]
            xs.append(x[rows])
            ys.append(y[rows])
            owners.append(np.full(len(rows), owner))
    if dropped:
        log.info("%s: %d clients with fewer than 2 samples left out (no train/test split possible)", name, dropped)
    if not parts["train"][2]:
        raise DataError(f"{name}: no client has the 2 samples a train/test split needs")
    return stack(parts)


def stack(parts: dict[str, list[list[np.ndarray]]]) -> dict:
    """Per split, the clients' [xs], [ys] and [owner columns] as the tensors a DatasetBundle takes."""
    out = {}
    for split, (xs, ys, owners) in parts.items():
        out[f"{split}_x"] = torch.from_numpy(np.ascontiguousarray(np.concatenate(xs)))
        out[f"{split}_y"] = torch.from_numpy(np.concatenate(ys).astype(np.int64))
        out[f"{split}_owner"] = torch.from_numpy(np.concatenate(owners).astype(np.int64))
    return out


def cached(name: str, files: list[Path], train_frac: float | None, decode, source: str = "leaf") -> dict:
    """`decode()`'s tensors, from the cache when these files (names, sizes, times) were decoded before."""
    digest = hashlib.sha1(f"{name} v{CACHE_VERSION} tf={train_frac}\n".encode())
    for path in files:
        stat = path.stat()
        digest.update(f"{path.resolve()}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    try:
        cache = cache_folder() / f"{name}-{source}-{digest.hexdigest()[:16]}.pt"
    except DataError as err:  # the cache saves parsing time; the run works without it
        log.warning("%s; reading %s's files without a cache (again on every run)", err, name)
        return decode()
    if cache.is_file():
        try:
            return torch.load(cache, weights_only=True)
        except Exception as err:  # noqa: BLE001 - unpickling a damaged file raises almost anything
            log.warning("ignoring unreadable cache %s (%s); reading the files again", cache, err)
    tensors = decode()
    try:
        _save_atomically(tensors, cache)
    except OSError as err:
        log.warning("could not write the cache %s (%s); the next run reads the files again", cache, err)
    return tensors


def femnist(root: str, *, mean: Sequence[float], std: Sequence[float], augment: bool = False, train_frac: float = 0.9,
            download: bool = False,
            default_model: str | None = None) -> DatasetBundle:
    """FEMNIST: EMNIST by writer, 62 classes, 1x28x28, from `root/femnist/all_data/*.json` or TFF's h5 files
    (the module's docstring says which). LEAF and TFF store pixels as floats in [0, 1] (white background near 1);
    they become round(255 v). `train_frac` applies to LEAF's files (TFF's come split)."""
    del default_model  # the backbone fedagg.run trains when no model is chosen
    kind, folder, files = _files("femnist", root, download)

    def decode_tff() -> dict:
        return stack(tff.femnist_parts(files, _pixels_to_uint8, FEMNIST_CLASSES))

    def decode() -> dict:
        per_user = []
        for user, x, y in _users("femnist", files):
            pixels = np.asarray(x, dtype=np.float32).reshape(-1, 1, FEMNIST_SIDE, FEMNIST_SIDE)
            labels = np.asarray(y, dtype=np.int64)
            if len(labels) != len(pixels) or (labels.size and not 0 <= labels.min() <= labels.max() < FEMNIST_CLASSES):
                raise DataError(f"femnist: writer {user} in {folder} has {len(pixels)} images but labels "
                                f"{labels.tolist()[:5]}...; LEAF's labels are 0..61, one per image")
            per_user.append((_pixels_to_uint8(pixels), labels))
        return _split("femnist", per_user, train_frac, in_order=False)

    t = (cached("femnist", files, train_frac, decode) if kind == "leaf"
         else cached("femnist", files, None, decode_tff, source="tff"))
    return DatasetBundle("femnist", t["train_x"], t["train_y"], t["test_x"], t["test_y"], FEMNIST_CLASSES, mean, std,
                         augment, train_owner=t["train_owner"], test_owner=t["test_owner"])


def _pixels_to_uint8(pixels: np.ndarray) -> np.ndarray:
    return np.rint(np.clip(pixels, 0, 1) * 255).astype(np.uint8)


def encode(text: str) -> list[int]:
    """Indices in VOCABULARY; a character outside it becomes a space (LEAF's own lookup would give -1)."""
    space = VOCABULARY.index(" ")
    return [VOCABULARY.find(c) if c in VOCABULARY else space for c in text]


def shakespeare(root: str, *, train_frac: float = 0.8, download: bool = False,
                default_model: str | None = None) -> DatasetBundle:
    """Shakespeare: next-character prediction over LEAF's 80 characters, one client per speaking role, from
    `root/shakespeare/all_data/*.json` or TFF's h5 files (the module's docstring says which; fedagg.data.tff how
    TFF's snippets become LEAF's samples). A sample is LEAF's 80-character x and its next character y, kept as
    81 tokens: the model reads the first 80 and is scored at every position against the next one. `train_frac`
    applies to LEAF's files (TFF's come split)."""
    del default_model  # the backbone fedagg.run trains when no model is chosen
    kind, folder, files = _files("shakespeare", root, download)

    def decode_tff() -> dict:
        return stack(tff.shakespeare_parts(files, encode, VOCABULARY, SEQUENCE))

    def decode() -> dict:
        per_user, unknown = [], 0
        for user, x, y in _users("shakespeare", files):
            rows = [s + c for s, c in zip(x, y)]
            if len(x) != len(y) or any(len(s) != SEQUENCE or len(c) != 1 for s, c in zip(x, y)):
                raise DataError(f"shakespeare: role {user} in {folder} is not LEAF's format ({SEQUENCE}-character "
                                "x strings, one-character y strings, as many of each)")
            unknown += sum(c not in VOCABULARY for r in rows for c in r)
            tokens = np.asarray([encode(r) for r in rows], dtype=np.uint8).reshape(-1, SEQUENCE + 1)
            per_user.append((tokens, tokens[:, -1].astype(np.int64)))
        if unknown:
            log.warning("shakespeare: %d characters outside LEAF's vocabulary read as spaces", unknown)
        return _split("shakespeare", per_user, train_frac, in_order=True)

    t = (cached("shakespeare", files, train_frac, decode) if kind == "leaf"
         else cached("shakespeare", files, None, decode_tff, source="tff"))
    return DatasetBundle("shakespeare", t["train_x"], t["train_y"], t["test_x"], t["test_y"], len(VOCABULARY), (0.0,),
                         (1.0,), False, inputs="tokens", train_owner=t["train_owner"], test_owner=t["test_owner"])
