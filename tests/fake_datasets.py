"""Tiny datasets in the genuine on-disk formats, so every loader is tested without network.

Each writer returns what a correct loader must produce (labels, and pixels where the
format is lossless) so the tests compare against the source rather than the loader.
"""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
from PIL import Image

IDX_UBYTE = 0x08


def write_idx_gz(path: Path, array: np.ndarray) -> None:
    """IDX: two zero bytes, a type byte, the rank, big-endian uint32 dims, then the data."""
    header = struct.pack(">HBB", 0, IDX_UBYTE, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def write_fashion_mnist(root: Path, n_train: int = 12, n_test: int = 5, seed: int = 0) -> dict[str, np.ndarray]:
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    out = {}
    for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
        out[f"{split}_x"] = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        out[f"{split}_y"] = rng.integers(0, 10, n).astype(np.uint8)
        write_idx_gz(raw / f"{prefix}-images-idx3-ubyte.gz", out[f"{split}_x"])
        write_idx_gz(raw / f"{prefix}-labels-idx1-ubyte.gz", out[f"{split}_y"])
    return out


def _pickle(path: Path, obj: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)  # the official files are Python 2 pickles


def write_cifar(root: Path, hundred: bool = False, per_file: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    """CIFAR-10 (5 training batches) or CIFAR-100 (one train file) with `per_file` images each.

    Rows are 3072 bytes: the 1024 red, then green, then blue values, row-major, so
    reshape(-1, 3, 32, 32) gives the expected NCHW tensor.
    """
    rng = np.random.default_rng(seed)
    classes = 100 if hundred else 10
    folder = root / ("cifar-100-python" if hundred else "cifar-10-batches-py")
    folder.mkdir(parents=True)
    files = {"train": ["train"], "test": ["test"]} if hundred else {
        "train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
    label_key = "fine_labels" if hundred else "labels"
    out = {}
    for split, names in files.items():
        xs, ys = [], []
        for name in names:
            data = rng.integers(0, 256, (per_file, 3072), dtype=np.uint8)
            labels = rng.integers(0, classes, per_file).tolist()
            entry = {"batch_label": name, label_key: labels, "data": data, "filenames": [f"{name}_{i}.png" for i in range(per_file)]}
            if hundred:
                entry["coarse_labels"] = [y // 5 for y in labels]
            _pickle(folder / name, entry)
            xs.append(data)
            ys += labels
        out[f"{split}_x"] = np.concatenate(xs).reshape(-1, 3, 32, 32)
        out[f"{split}_y"] = np.array(ys)
    if hundred:
        _pickle(folder / "meta", {"fine_label_names": [f"fine{i}" for i in range(100)],
                                  "coarse_label_names": [f"coarse{i}" for i in range(20)]})
    else:
        _pickle(folder / "batches.meta", {"label_names": [f"class{i}" for i in range(10)],
                                          "num_cases_per_batch": per_file, "num_vis": 3072})
    return out


def solid_jpeg(path: Path, size: tuple[int, int], color: tuple[int, int, int], mode: str = "RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.new("RGB", size, color)
    (img.convert(mode) if mode != "RGB" else img).save(path, "JPEG", quality=95)


def write_tiny_imagenet(root: Path) -> dict[str, list]:
    """2 classes, 3 training and 2 val images each, every image one solid colour.

    wnids.txt lists the classes unsorted, so the loader must sort them. One training
    image is grayscale JPEG, as some in the real set are.
    """
    folder = root / "tiny-imagenet-200"
    wnids = ["n09999999", "n01111111"]  # sorted: n01111111 -> 0, n09999999 -> 1
    folder.mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(wnids) + "\n")
    (folder / "words.txt").write_text("n01111111\tfirst\nn09999999\tsecond\n")
    out = {"train_y": [], "train_colors": [], "test_y": [], "test_colors": []}
    for label, wnid in enumerate(sorted(wnids)):
        (folder / "train" / wnid / "images").mkdir(parents=True)
        (folder / "train" / wnid / f"{wnid}_boxes.txt").write_text("")
        for i in range(3):
            gray = label == 1 and i == 0
            color = (90, 90, 90) if gray else (40 + 100 * label, 20 * i, 200 - 50 * i)
            solid_jpeg(folder / "train" / wnid / "images" / f"{wnid}_{i}.JPEG", (64, 64), color, "L" if gray else "RGB")
            out["train_y"].append(label)
            out["train_colors"].append(color)
    lines = []
    for i, (wnid, color) in enumerate([("n09999999", (250, 10, 10)), ("n01111111", (10, 250, 10)),
                                       ("n01111111", (10, 10, 250)), ("n09999999", (128, 64, 32))]):
        solid_jpeg(folder / "val" / "images" / f"val_{i}.JPEG", (64, 64), color)
        lines.append(f"val_{i}.JPEG\t{wnid}\t0\t0\t63\t63")
        out["test_y"].append(sorted(wnids).index(wnid))
        out["test_colors"].append(color)
    (folder / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    (folder / "test" / "images").mkdir(parents=True)  # unlabelled in the real set; unused
    return out


def framed_jpeg(path: Path, size: tuple[int, int]) -> None:
    """White square as large as the shorter side, centred, black bars on the longer side:
    a correct shorter-side resize plus centre crop keeps only white."""
    w, h = size
    img = Image.new("RGB", size, (0, 0, 0))
    s = min(w, h)
    left, top = (w - s) // 2, (h - s) // 2
    img.paste((255, 255, 255), (left, top, left + s, top + s))
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, "JPEG", quality=95)


def write_imagenet(root: Path) -> dict[str, list[int]]:
    """ImageFolder layout, 2 classes, images of several non-square sizes (and one PNG)."""
    folder = root / "imagenet"
    sizes = {"train": [(120, 60), (50, 90), (77, 77)], "val": [(100, 40)]}
    out = {"train_y": [], "test_y": []}
    for split, key in (("train", "train_y"), ("val", "test_y")):
        for label, wnid in enumerate(["n01440764", "n01443537"]):
            for i, size in enumerate(sizes[split]):
                framed_jpeg(folder / split / wnid / f"{wnid}_{i}.JPEG", size)
                out[key].append(label)
    (folder / "train" / "n01440764" / "notes.txt").write_text("not an image")
    png = Image.new("RGB", (40, 30), (255, 255, 255))
    png.save(folder / "train" / "n01443537" / "zz_extra.png")  # sorts last within its class
    out["train_y"].append(1)
    return out
