"""FEMNIST and Shakespeare from TensorFlow Federated's published h5 files, the source fedagg downloads.

Why this source: LEAF publishes only its preprocessing (it needs the 1 GB NIST download and LEAF's
scripts); TFF publishes the processed result, derived from LEAF's preprocessing, as one archive per
dataset at a stable Google Cloud Storage address, with the SHA-256 its own loaders check
(fedagg/data/download.py holds both). It needs h5py (the `natural` extra), a small library, rather
than TFF or TensorFlow. What it holds differs from LEAF's full set: 3,400 writers (TFF dropped writers
with fewer than 2 samples) and 715 speaking roles, each already cut into a train and a test file.

Layout (TFF's HDF5ClientData): `examples/<client id>/pixels` (float32 [n, 28, 28], as LEAF stores them,
white background near 1) and `examples/<client id>/label` ([n]) for EMNIST;
`examples/<client id>/snippets` (strings, each a contiguous passage of the role's lines) for Shakespeare.
Each client's train-file samples are its training split and its test-file samples its own test split
(TFF's split, used as is: `train_frac` does not apply). Clients are taken in sorted id order.

Shakespeare's snippets become LEAF's samples exactly as LEAF's shake_utils.py turns a role's text into
them: each line (with its newline, where it has one) has runs of two or more spaces collapsed to one,
is prefixed with 80 spaces, and every window of 80 characters with the character after it is a sample
(one per character of the line); characters outside LEAF's 80 read as spaces (fedagg.data.leaf.encode).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np

from fedagg.data.download import fetch, source
from fedagg.data.files import DataError, data_root

log = logging.getLogger(__name__)

FILES = {"femnist": ("fed_emnist_train.h5", "fed_emnist_test.h5"),
         "shakespeare": ("shakespeare_train.h5", "shakespeare_test.h5")}
FOLDER = "tff"  # data.root/<name>/tff/, beside LEAF's data.root/<name>/all_data/


def folder(name: str, root: str) -> Path:
    return data_root(root) / name / FOLDER


def how(name: str, root: str) -> str:
    """What to put where, for the not-found message."""
    url = source(name).files[0][0]
    return (f"put {' and '.join(FILES[name])} (unpacked from {url}) in {folder(name, root)}, "
            "or set data.download=true to fetch them (needs h5py: pip install 'fedagg[natural]')")


def h5py():
    try:
        import h5py as module
    except ImportError:
        raise DataError("reading TFF's FEMNIST/Shakespeare h5 files needs h5py: pip install 'fedagg[natural]' "
                        "(or pip install h5py)") from None
    return module


def provide(name: str, root: str, download: bool, how_by_hand: str) -> list[Path] | None:
    """TFF's train and test files of `name`, downloaded first when missing and `download` is on; None when
    they are missing and not to be downloaded. h5py is checked before any download (no fetch it cannot read)."""
    where = folder(name, root)
    files = [where / f for f in FILES[name]]
    present = lambda: all(f.is_file() for f in files)  # noqa: E731
    if not present() and not download:
        return None
    h5py()
    if not present():
        log.info("%s: fetching TFF's files into %s", name, where)
        fetch(name, where.parent, how_by_hand, present)
    return files


def _unreadable(name: str, path: Path, err: Exception) -> DataError:
    return DataError(f"{name}: cannot read {path} as TFF's h5 file ({type(err).__name__}: {err}); fetch it again, "
                     f"or remove it and set data.download=true")


def _clients(name: str, files: list[Path], features: tuple[str, ...]):
    """(client id, {feature: train array}, {feature: test array}) for every client, in sorted id order; a file that
    is not TFF's is named."""
    h5 = h5py()
    opened = []
    try:
        for path in files:
            try:
                opened.append(h5.File(path, "r"))
                opened[-1]["examples"].keys()
            except (OSError, KeyError) as err:
                raise _unreadable(name, path, err) from None
        train, test = opened
        ids, test_ids = sorted(train["examples"]), set(test["examples"])
        if set(ids) != test_ids:
            odd = sorted(set(ids) ^ test_ids)[0]
            raise DataError(f"{name}: client {odd} is in only one of {files[0].name} and {files[1].name}; "
                            f"TFF's files hold every client in both: fetch them again into {files[0].parent}")
        for cid in ids:
            rows = []
            for path, h5file in zip(files, opened):
                try:
                    rows.append({f: h5file["examples"][cid][f][()] for f in features})
                except (OSError, KeyError) as err:
                    raise _unreadable(name, path, err) from None
            yield (cid, *rows)
    finally:
        for h5file in opened:
            h5file.close()


def femnist_parts(files: list[Path], pixels_to_uint8, classes: int) -> dict[str, list[list[np.ndarray]]]:
    """Per split, the writers' images (uint8 [n, 1, 28, 28], by `pixels_to_uint8`), labels and owner columns."""
    parts: dict[str, list[list[np.ndarray]]] = {"train": [[], [], []], "test": [[], [], []]}
    for owner, (cid, *splits) in enumerate(_clients("femnist", files, ("pixels", "label"))):
        for split, data in zip(("train", "test"), splits):
            labels = np.asarray(data["label"], dtype=np.int64).reshape(-1)
            pixels = np.asarray(data["pixels"], dtype=np.float32)
            if len(labels) != len(pixels) or not len(labels) or not 0 <= labels.min() <= labels.max() < classes:
                raise DataError(f"femnist: writer {cid} of TFF's {split} file has {len(pixels)} images and labels "
                                f"{labels.tolist()[:5]}...; TFF's labels are 0..{classes - 1}, one per image")
            xs, ys, owners = parts[split]
            xs.append(pixels_to_uint8(pixels.reshape(-1, 1, 28, 28)))
            ys.append(labels)
            owners.append(np.full(len(labels), owner))
    return parts


def line_samples(line: str, encode, sequence: int) -> np.ndarray:
    """LEAF's samples of one line (shake_utils.py): spaces collapsed, `sequence` spaces before it, every window."""
    tokens = np.asarray(encode(" " * sequence + re.sub(r"   *", " ", line)), dtype=np.uint8)
    return np.lib.stride_tricks.sliding_window_view(tokens, sequence + 1)


def shakespeare_parts(files: list[Path], encode, vocabulary: str, sequence: int) -> dict[str, list[list[np.ndarray]]]:
    """Per split, the roles' samples (uint8 [n, sequence + 1] token ids), next-character labels and owner columns.
    A role with no sample on one side (empty snippets) is left out, as LEAF leaves out roles with no data."""
    parts: dict[str, list[list[np.ndarray]]] = {"train": [[], [], []], "test": [[], [], []]}
    unknown = dropped = 0
    for cid, *splits in _clients("shakespeare", files, ("snippets",)):
        rows = []
        for data in splits:
            texts = [s.decode("utf-8") if isinstance(s, bytes) else str(s) for s in np.asarray(data["snippets"]).ravel()]
            unknown += sum(c not in vocabulary for t in texts for c in t)
            lines = [line for t in texts for line in t.splitlines(keepends=True)]
            rows.append(np.concatenate([line_samples(x, encode, sequence) for x in lines])
                        if lines else np.zeros((0, sequence + 1), np.uint8))
        if not all(len(r) for r in rows):
            dropped += 1
            continue
        owner = len(parts["train"][2])
        for split, tokens in zip(("train", "test"), rows):
            xs, ys, owners = parts[split]
            xs.append(np.ascontiguousarray(tokens))
            ys.append(tokens[:, -1].astype(np.int64))
            owners.append(np.full(len(tokens), owner))
    if unknown:
        log.warning("shakespeare: %d characters outside LEAF's vocabulary read as spaces", unknown)
    if dropped:
        log.info("shakespeare: %d roles with no text in TFF's train or test file left out", dropped)
    if not parts["train"][2]:
        raise DataError(f"shakespeare: no role in {files[0].parent} has text in both TFF files")
    return parts
