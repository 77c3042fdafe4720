"""Datasets as whole uint8 tensors, one loader per `conf/dataset/*.yaml`.

Each loader reads one on-disk format under `root` and returns a `DatasetBundle` that the
run moves to the device once (DESIGN principle 6). A missing dataset with a public source
is downloaded first when `download` is on (fedagg.data.download); otherwise, or for
ImageNet, it is a `DatasetNotFoundError` that says where it looked and how to put the
files there.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedagg.data.download import fetch
from fedagg.data.files import DataError, cache_dir, cache_folder, data_root, md5
from fedagg.data.idx_files import GZIP_DAMAGE, extracted, fetch_again, idx_damage, place, writable

log = logging.getLogger(__name__)


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are not where the config says; the message says how to fix it."""


# What a dataset's samples are, and the tensor each split must be (fedagg.data.device prepares each kind):
# images are normalised and augmented; vectors (Synthetic's features, [N, D, 1, 1]) are used as they are;
# tokens [N, T + 1] are a sequence and the character after it, the model reading the first T and
# predicting the last T (next-character targets at every position); text [N, T] is one token sequence per
# sample with its class as the label (int64: a tokenizer's ids may pass 255).
INPUT_KINDS = {"images": (torch.uint8, 4, "uint8 [N, C, H, W]"), "vectors": (torch.float32, 4, "float32 [N, D, 1, 1]"),
               "tokens": (torch.uint8, 2, "uint8 [N, T + 1]"), "text": (torch.int64, 2, "int64 [N, T]")}


@dataclass
class DatasetBundle:
    name: str
    train_x: Tensor  # uint8 [N, C, H, W], CPU, contiguous (other kinds: see INPUT_KINDS)
    train_y: Tensor  # int64 [N]: the class (tokens: the character after the sequence)
    test_x: Tensor  # uint8 [M, C, H, W]
    test_y: Tensor  # int64 [M]
    num_classes: int
    mean: tuple[float, ...]  # per channel, on the 0-1 scale (x / 255)
    std: tuple[float, ...]
    augment: bool  # random crop (pad 4; or unpadded to `crop`) + horizontal flip, applied on the device
    inputs: str = "images"  # a key of INPUT_KINDS
    # A federated dataset's own clients (partition=natural): the client each sample belongs to, [N] and [M],
    # with every client's test samples in test_x; None for a centralised dataset.
    train_owner: Tensor | None = None
    test_owner: Tensor | None = None
    # A square crop of every image (train: random, test: central; fedagg.data.device): what the model is built
    # for, `image_size`. None: the images as they are (with `augment`, the padded crop of their own size).
    crop: int | None = None

    def __post_init__(self) -> None:
        # Hydra hands over ListConfig; plain floats keep the bundle picklable and printable.
        self.mean = tuple(float(v) for v in self.mean)
        self.std = tuple(float(v) for v in self.std)
        self.augment = bool(self.augment)
        if self.inputs not in INPUT_KINDS:
            raise ValueError(f"{self.name}: inputs={self.inputs!r}; it must be one of {', '.join(INPUT_KINDS)}")
        dtype, dims, words = INPUT_KINDS[self.inputs]
        for split in ("train", "test"):
            x, y = getattr(self, f"{split}_x"), getattr(self, f"{split}_y")
            if x.dtype != dtype or x.dim() != dims or y.dtype != torch.int64 or len(x) != len(y):
                raise ValueError(f"{self.name}: {split} set must be {words} with int64 [N] labels")
            owner = getattr(self, f"{split}_owner")
            if owner is not None and (owner.dtype != torch.int64 or owner.shape != y.shape):
                raise ValueError(f"{self.name}: {split}_owner must be int64 [N], one client id per sample")
        if (self.train_owner is None) != (self.test_owner is None):
            raise ValueError(f"{self.name}: natural clients need both train_owner and test_owner")
        if self.crop is not None:
            side = self.train_x.shape[-1] if self.inputs == "images" else 0
            if isinstance(self.crop, bool) or not isinstance(self.crop, int) or not 1 <= self.crop <= side:
                raise ValueError(f"dataset.crop={self.crop!r} is not allowed; use null or a side in 1..{side} "
                                 f"(the images are {side}x{side}; Reddi et al. crop CIFAR to 24)")
        if len(self.mean) != self.in_channels or len(self.std) != self.in_channels:
            raise ValueError(f"{self.name}: mean and std need one value per channel ({self.in_channels})")

    @property
    def in_channels(self) -> int:
        return 1 if self.inputs in ("tokens", "text") else self.train_x.shape[1]

    @property
    def image_size(self) -> int:
        """The side of a square image (of its crop, when cropped); a token sequence's length (what a sequence
        model is built for)."""
        if self.crop is not None:
            return self.crop
        if self.inputs == "text":
            return self.train_x.shape[1]
        return self.train_x.shape[1] - 1 if self.inputs == "tokens" else self.train_x.shape[2]


def _not_found(name: str, folder: Path, expected: Sequence[str], how: str, problem: str | list[str]) -> DatasetNotFoundError:
    if not isinstance(problem, str):  # the list of missing entries
        problem = f"missing {', '.join(problem)}" if folder.is_dir() else "no such folder"
    return DatasetNotFoundError(
        f"{name} not found: {problem} in {folder}\n"
        f"  expected there: {', '.join(expected)}\n"
        f"  to provide {name}: {how}"
    )


def _require(name: str, folder: Path, expected: Sequence[str], how: str, check: Sequence[str] | None = None,
             download: bool = False) -> None:
    """Raise when any of `check` (default: `expected`) is missing under `folder`, after downloading it if asked."""
    entries = expected if check is None else check
    missing = lambda: [rel for rel in entries if not (folder / rel).exists()]  # noqa: E731
    if download and missing():
        fetch(name, folder.parent, how, lambda: not missing())
    if missing():
        raise _not_found(name, folder, expected, how, missing())


def _tv():
    """torchvision's datasets, imported when a dataset needs them: importing torchvision pulls in torch's
    compiler stack, seconds of start-up a run on the bundled digits never needs."""
    from torchvision import datasets

    return datasets


def _torchvision_how(cls: type | str, folder: Path) -> str:
    named = cls if isinstance(cls, str) else cls.__name__
    return (
        f"on a machine with network run python -c \"import torchvision; torchvision.datasets.{named}"
        f"('DIR', download=True)\" and copy DIR/{folder.name} to {folder} "
        f"(or set data.root to a folder that holds {folder.name}/)"
    )


def _from_hwc(array: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).permute(0, 3, 1, 2).contiguous()


def _labels(values) -> Tensor:
    return torch.as_tensor(np.asarray(values), dtype=torch.int64)


# --- scikit-learn digits ----------------------------------------------------------------


def digits(root: str | None = None, *, mean: Sequence[float], std: Sequence[float], augment: bool = False,
           download: bool = False,
           default_model: str | None = None) -> DatasetBundle:
    """scikit-learn's bundled 1x8x8 digits (1,797 images); `root` is ignored.

    The pixel values 0..16 become round(v * 255 / 16) so every dataset shares the uint8
    pipeline; the split is fixed (stratified 80/20, random_state 0) so results compare
    across runs and machines.
    """
    del default_model  # the backbone fedagg.run trains when no model is chosen; nothing to load
    del root, download  # bundled with scikit-learn
    cached = cache_dir() / "digits-split-v1.pt"  # importing scikit-learn takes seconds; the split never changes
    t = None
    if cached.is_file():
        try:
            t = torch.load(cached)
        except Exception as err:  # noqa: BLE001 - unpickling a damaged file raises almost anything; ours to write again
            log.warning("ignoring unreadable cache %s (%s); splitting the digits again", cached, err)
    if t is None:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        data = load_digits()
        images = np.rint(data.images * (255 / 16)).astype(np.uint8)[:, None]
        x_tr, x_te, y_tr, y_te = train_test_split(images, data.target, test_size=0.2, stratify=data.target,
                                                  random_state=0)
        t = {"train_x": torch.from_numpy(x_tr).contiguous(), "train_y": _labels(y_tr),
             "test_x": torch.from_numpy(x_te).contiguous(), "test_y": _labels(y_te)}
        _save_digits(t, cached)
    return DatasetBundle("digits", t["train_x"], t["train_y"], t["test_x"], t["test_y"], 10, mean, std, augment)


def _save_digits(t: dict, cached: Path) -> None:
    try:
        cache_folder()
    except DataError as err:  # the cache only saves start-up time: the bundled digits work without it
        log.warning("%s; the digits split is not cached", err)
        return
    tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
    try:
        torch.save(t, tmp)
        os.replace(tmp, cached)  # concurrent runs each write whole files
    except OSError as err:
        tmp.unlink(missing_ok=True)
        log.warning("could not cache the digits split in %s (%s)", cached, err)


# --- MNIST and Fashion-MNIST (IDX files) ------------------------------------------------


@dataclass(frozen=True)
class IdxSet:
    """An IDX dataset as torchvision lays it out (`<folder>/raw/<file>`), read here without torchvision: importing
    it costs more than a second of start-up (its models import torch's compiler)."""

    folder: str  # MNIST, FashionMNIST: torchvision's class name, which names the folder
    classes: int = 10
    files: tuple[str, ...] = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                              "t10k-labels-idx1-ubyte")


MNIST_FILES, FASHION_MNIST_FILES = IdxSet("MNIST"), IdxSet("FashionMNIST")
IDX_TYPES = {0x08: torch.uint8, 0x09: torch.int8, 0x0B: torch.int16, 0x0C: torch.int32, 0x0D: torch.float32,
             0x0E: torch.float64}


def read_idx(path: Path) -> Tensor:
    """An IDX file's tensor (LeCun's format: two zero bytes, a type code, the number of dimensions, each size as a
    big-endian int32, then the values big-endian); a file of the wrong length raises ValueError."""
    raw = path.read_bytes()
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] not in IDX_TYPES:
        raise ValueError(f"{path} is not an IDX file")
    dtype, ndim = IDX_TYPES[raw[2]], raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    start, width = 4 + 4 * ndim, torch.empty((), dtype=dtype).element_size()
    if len(raw) != start + math.prod(shape) * width:
        raise ValueError(f"{path} holds {len(raw)} bytes where its header promises {start + math.prod(shape) * width}")
    values = torch.frombuffer(bytearray(raw[start:]), dtype=dtype) if shape and math.prod(shape) else torch.empty(0, dtype=dtype)
    if width > 1 and sys.byteorder == "little":
        values = values.view(torch.uint8).view(-1, width).flip(1).contiguous().view(dtype).view(-1)
    return values.view(*shape)


def _idx_names(cls: IdxSet) -> list[str]:
    return list(cls.files)


def _idx_root(cls: IdxSet, name: str, root: Path, download: bool) -> Path:
    """A folder X with X/<cls>/raw/<extracted IDX files>, as torchvision's reader requires.

    Copies often ship only the .gz files (torchvision extracts them on download); these
    are extracted next to themselves, or into the cache when the data folder is read-only.
    A .gz that does not decompress is downloaded again when `download` is on.
    """
    raw = root / cls.folder / "raw"
    names = _idx_names(cls)
    expected = [f"{n} (or {n}.gz)" for n in names]
    missing = lambda: [n for n in names if not (raw / n).is_file() and not (raw / f"{n}.gz").is_file()]  # noqa: E731
    how = _torchvision_how(cls.folder, root / cls.folder)
    if download and missing():
        fetch(name, root, how, lambda: not missing())
    if missing():
        raise _not_found(name, raw, expected, how, missing())
    if all(extracted(raw / n, raw / f"{n}.gz") for n in names):
        return root

    target = raw if writable(raw) else cache_folder(f"{cls.folder}/raw")
    for n in names:
        gz = raw / f"{n}.gz"
        if extracted(target / n, gz):
            continue
        try:
            place(raw, n, target)
        except GZIP_DAMAGE as err:
            fetch_again(name, root, gz, how, f"{type(err).__name__}: {err}", download)
            try:
                place(raw, n, target)
            except GZIP_DAMAGE as again:  # the official file, checked, and still not gzip: say so, once
                raise DataError(f"{name}: {gz} was downloaded again and still does not decompress "
                                f"({type(again).__name__}: {again})") from None
    return target.parent.parent


def _idx_dataset(cls: IdxSet, name: str, root: str, mean, std, augment: bool, download: bool) -> DatasetBundle:
    base = _idx_root(cls, name, data_root(root), download)
    raw = base / cls.folder / "raw"
    try:
        train_x, train_y, test_x, test_y = (read_idx(raw / f) for f in cls.files)
    except Exception:
        # a cut-short or foreign file: name it when its length gives it away
        damage = idx_damage(raw, _idx_names(cls))
        if damage is None:
            raise
        raise DataError(f"{name}: {damage}; replace it (and its .gz) with a good copy "
                        f"({_torchvision_how(cls.folder, Path(root).expanduser().resolve() / cls.folder)})") from None
    return DatasetBundle(
        name, train_x.unsqueeze(1).contiguous(), train_y.long(), test_x.unsqueeze(1).contiguous(), test_y.long(),
        cls.classes, mean, std, augment,
    )


def mnist(root: str, *, mean: Sequence[float], std: Sequence[float], augment: bool = False,
          download: bool = False,
          default_model: str | None = None) -> DatasetBundle:
    """MNIST 1x28x28 from `root/MNIST/raw/` (torchvision's layout, plain or .gz IDX files)."""
    del default_model  # the backbone fedagg.run trains when no model is chosen; nothing to load
    return _idx_dataset(MNIST_FILES, "mnist", root, mean, std, augment, download)


def fmnist(root: str, *, mean: Sequence[float], std: Sequence[float], augment: bool = False,
           download: bool = False,
           default_model: str | None = None) -> DatasetBundle:
    """Fashion-MNIST 1x28x28 from `root/FashionMNIST/raw/` (plain or .gz IDX files)."""
    del default_model  # the backbone fedagg.run trains when no model is chosen; nothing to load
    return _idx_dataset(FASHION_MNIST_FILES, "fmnist", root, mean, std, augment, download)


# --- CIFAR (pickled batches) --------------------------------------------------------------


def _without_md5(cls: type) -> type:
    # torchvision's reader minus the checksums: already verified, or the user opted out (tests
    # write tiny files in the genuine format, which cannot match the official checksums).
    return type(cls.__name__, (cls,), {
        "train_list": [[f, None] for f, _ in cls.train_list],
        "test_list": [[f, None] for f, _ in cls.test_list],
        "meta": {**cls.meta, "md5": None},
    })


def _unreadable_pickle(folder: Path, files: dict[str, tuple[str, ...]]) -> str | None:
    """The first of `files` (name -> the keys its pickled dict must have) that is not such a dict, and why."""
    for file, keys in files.items():
        try:
            with open(folder / file, "rb") as f:
                entry = pickle.load(f, encoding="latin1")
        except Exception as err:  # noqa: BLE001 - unpickling arbitrary bytes can raise almost anything
            return f"{file} ({type(err).__name__}: {err})"
        if not isinstance(entry, dict) or not all(k in entry for k in keys):
            return f"{file} (not the pickled dict with {', '.join(keys)} it should be)"
    return None


def _cifar(cls: type, name: str, root: str, mean, std, augment: bool, verify_md5: bool, download: bool,
           crop: int | None = None) -> DatasetBundle:
    root_path = data_root(root)
    folder = root_path / cls.base_folder
    checksums = [*cls.train_list, *cls.test_list, [cls.meta["filename"], cls.meta["md5"]]]
    expected = [f for f, _ in checksums]
    how = _torchvision_how(cls, folder)
    _require(name, folder, expected, how, download=download)
    if verify_md5:
        bad = [f for f, digest in checksums if md5(folder / f) != digest]
        if bad:
            raise DataError(f"{name}: {', '.join(bad)} in {folder} fail the official MD5 check (damaged, or not the "
                            f"official release); copy them again ({how}), or set dataset.verify_md5=false to load "
                            f"them anyway")
    reader = _without_md5(cls)  # verified just now, or the user opted out
    try:
        train = reader(str(root_path), train=True, download=False)
        test = reader(str(root_path), train=False, download=False)
    except Exception:
        # torchvision's reader on files that are not CIFAR batches: name the file when one is to blame
        batch = ("data", "fine_labels" if name == "cifar100" else "labels")
        bad = _unreadable_pickle(folder, {**{f: batch for f in expected[:-1]}, expected[-1]: (cls.meta["key"],)})
        if bad is None:
            raise
        raise DataError(f"{name}: cannot read {bad} in {folder}; copy it again ({how})") from None
    return DatasetBundle(
        name, _from_hwc(train.data), _labels(train.targets), _from_hwc(test.data), _labels(test.targets),
        len(train.classes), mean, std, augment, crop=crop,
    )


def cifar10(root: str, *, mean: Sequence[float], std: Sequence[float], augment: bool = True,
            verify_md5: bool = True, download: bool = False,
            default_model: str | None = None, crop: int | None = None) -> DatasetBundle:
    """CIFAR-10 3x32x32 from `root/cifar-10-batches-py/` (the python-pickle release)."""
    del default_model  # the backbone fedagg.run trains when no model is chosen; nothing to load
    return _cifar(_tv().CIFAR10, "cifar10", root, mean, std, augment, verify_md5, download, crop)


def cifar100(root: str, *, mean: Sequence[float], std: Sequence[float], augment: bool = True,
             verify_md5: bool = True, download: bool = False,
             default_model: str | None = None, crop: int | None = None) -> DatasetBundle:
    """CIFAR-100 3x32x32, the 100 fine labels, from `root/cifar-100-python/`."""
    del default_model  # the backbone fedagg.run trains when no model is chosen; nothing to load
    return _cifar(_tv().CIFAR100, "cifar100", root, mean, std, augment, verify_md5, download, crop)


def cifar100_fl(root: str, *, mean: Sequence[float], std: Sequence[float], augment: bool = True,
                verify_md5: bool = True, download: bool = False,
                default_model: str | None = None, crop: int | None = None) -> DatasetBundle:
    """CIFAR-100 as federated by Reddi et al. 2021 (App. C): the `cifar100` files, whose training set
    `partition=pachinko` splits into 500 clients of 100 images; the test set is cifar100's."""
    del default_model  # the backbone fedagg.run trains when no model is chosen; nothing to load
    bundle = _cifar(_tv().CIFAR100, "cifar100", root, mean, std, augment, verify_md5, download, crop)
    bundle.name = "cifar100_fl"
    return bundle
