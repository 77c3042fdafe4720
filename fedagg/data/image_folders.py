"""Decode folders of JPEGs (Tiny-ImageNet, ImageNet) into uint8 tensors, once.

Decoding tens of thousands of JPEGs takes minutes while loading one tensor file takes
seconds, so a folder dataset is decoded a single time into a `.pt` file in the cache and
every later run (and every process of a multirun) reads that file instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
_CHUNK = 256  # images per thread-pool task: one future per image would cost more than the decode


def list_class_folder(folder: Path, classes: list[str], subdir: str = "") -> tuple[list[Path], list[int]]:
    """Image files of `folder/<class>/<subdir>/`, labelled by the class's position in `classes`.

    Sorted, so the order (and with it every seeded partition) is the same on every machine.
    A class without a folder contributes nothing rather than failing: ImageNet-style val
    folders may hold only some classes.
    """
    files: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        directory = folder / name / subdir
        if not directory.is_dir():
            continue
        for entry in sorted(os.listdir(directory)):
            if entry.lower().endswith(IMAGE_SUFFIXES):
                files.append(directory / entry)
                labels.append(label)
    return files, labels


def read_annotated_folder(folder: Path, annotations: str, index: dict[str, int]) -> tuple[list[Path], list[int]]:
    """Files of `folder/images/` labelled by a tab-separated `file<TAB>class...` list
    (Tiny-ImageNet's val split); kept in the list's order."""
    files: list[Path] = []
    labels: list[int] = []
    for line in (folder / annotations).read_text().splitlines():
        fields = line.split("\t")  # file, class, then a bounding box that is not used here
        if len(fields) < 2:
            continue
        if fields[1] not in index:
            raise ValueError(f"{folder / annotations} names class {fields[1]!r}, which is not in the class list")
        files.append(folder / "images" / fields[0])
        labels.append(index[fields[1]])
    return files, labels


def decode_image(path: Path, size: int) -> np.ndarray:
    """One image as HWC uint8 RGB of size×size: shorter side resized to `size`, centre crop."""
    try:
        with Image.open(path) as img:
            # draft lets libjpeg shrink by 1/2, 1/4 or 1/8 while decoding, never below
            # `size` on either side: full-size ImageNet decodes several times faster.
            img.draft("RGB", (size, size))
            img = img.convert("RGB")  # grayscale and CMYK JPEGs occur in both ImageNets
    except OSError as err:  # PIL's UnidentifiedImageError is an OSError too
        raise ValueError(f"cannot decode image {path}: {err}") from err
    width, height = img.size
    if (width, height) != (size, size):
        scale = size / min(width, height)
        new_size = (max(size, round(width * scale)), max(size, round(height * scale)))
        img = img.resize(new_size, Image.Resampling.BICUBIC)
        left, top = (new_size[0] - size) // 2, (new_size[1] - size) // 2
        img = img.crop((left, top, left + size, top + size))
    return np.array(img)  # a writable copy: torch refuses to share read-only buffers


def decode_all(files: list[Path], size: int, workers: int | None = None) -> Tensor:
    """uint8 [N, 3, size, size]; PIL releases the GIL while decoding, so threads scale."""
    out = torch.empty((len(files), 3, size, size), dtype=torch.uint8)

    def work(start: int) -> None:
        for i in range(start, min(start + _CHUNK, len(files))):
            out[i] = torch.from_numpy(decode_image(files[i], size)).permute(2, 0, 1)

    workers = workers or min(32, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(work, range(0, len(files), _CHUNK)))  # list() re-raises a worker's error
    return out


def _fingerprint(splits: dict[str, tuple[list[Path], list[int]]], size: int) -> str:
    # File names and labels, not contents: enough to notice images added, removed or
    # moved between classes, without reading or stat-ing a million files.
    digest = hashlib.sha1(f"size={size}\n".encode())
    for split, (files, labels) in splits.items():
        digest.update(f"[{split}]\n".encode())
        for path, label in zip(files, labels):
            digest.update(f"{path}\t{label}\n".encode())
    return digest.hexdigest()


def load_or_decode(
    cache_file: Path | None, splits: dict[str, tuple[list[Path], list[int]]], size: int
) -> dict[str, Tensor]:
    """{"<split>_x": uint8 [N, 3, size, size], "<split>_y": int64 [N]} for each split.

    Read from `cache_file` when it was built from the same file list; otherwise decoded
    and written there for next time (None: no cache, decoded every time).
    """
    fingerprint = _fingerprint(splits, size)
    if cache_file is not None and cache_file.is_file():
        try:
            cached = torch.load(cache_file, weights_only=True)
        except Exception as err:  # noqa: BLE001 - unpickling a damaged file raises almost anything (KeyError too)
            log.warning("ignoring unreadable cache %s (%s); decoding again", cache_file, err)
        else:
            if cached.get("fingerprint") == fingerprint:
                return {k: v for k, v in cached.items() if k != "fingerprint"}
            log.info("the image folder changed since %s was written; decoding again", cache_file)

    tensors: dict[str, Tensor] = {}
    for split, (files, labels) in splits.items():
        log.info("decoding %d %s images at %dx%d (%s)", len(files), split, size, size,
                 f"once; cached in {cache_file}" if cache_file is not None else "not cached")
        tensors[f"{split}_x"] = decode_all(files, size)
        tensors[f"{split}_y"] = torch.tensor(labels, dtype=torch.int64)
    if cache_file is not None:
        try:
            _save_atomically({"fingerprint": fingerprint, **tensors}, cache_file)
        except OSError as err:  # a full or read-only disk costs the next run the decoding, not this run
            log.warning("could not write the decoded cache %s (%s); the next run decodes again", cache_file, err)
    return tensors


def _save_atomically(obj: dict, path: Path) -> None:
    # Write then rename, so a concurrent multirun process or an interrupted run never
    # leaves a half-written cache that the next run would trust.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
