"""Datasets as whole uint8 tensors, one loader per `conf/dataset/*.yaml`.

Each loader reads one on-disk format under `root` and returns a `DatasetBundle` that the
run moves to the device once (DESIGN principle 6). A missing dataset with a public source
is downloaded first when `download` is on (fedagg.data.download); otherwise, or for
ImageNet, it is a `DatasetNotFoundError` that says where it looked and how to put the
files there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedagg.data.download import fetch


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are not where the config says; the message says how to fix it."""


@dataclass
class DatasetBundle:
    name: str
    train_x: Tensor  # uint8 [N, C, H, W], CPU, contiguous
    train_y: Tensor  # int64 [N]
    test_x: Tensor  # uint8 [M, C, H, W]
    test_y: Tensor  # int64 [M]
    num_classes: int
    mean: tuple[float, ...]  # per channel, on the 0-1 scale (x / 255)
    std: tuple[float, ...]
    augment: bool  # random crop (pad 4) + horizontal flip, applied on the device

    def __post_init__(self) -> None:
        # Hydra hands over ListConfig; plain floats keep the bundle picklable and printable.
        self.mean = tuple(float(v) for v in self.mean)
        self.std = tuple(float(v) for v in self.std)
        self.augment = bool(self.augment)
        for split in ("train", "test"):
            x, y = getattr(self, f"{split}_x"), getattr(self, f"{split}_y")
            if x.dtype != torch.uint8 or x.dim() != 4 or y.dtype != torch.int64 or len(x) != len(y):
                raise ValueError(f"{self.name}: {split} set must be uint8 [N, C, H, W] with int64 [N] labels")
        if len(self.mean) != self.in_channels or len(self.std) != self.in_channels:
            raise ValueError(f"{self.name}: mean and std need one value per channel ({self.in_channels})")

    @property
    def in_channels(self) -> int:
        return self.train_x.shape[1]

    @property
    def image_size(self) -> int:
        return self.train_x.shape[2]


def cache_dir() -> Path:
    """Where decoded or extracted copies go when the data folder itself is read-only."""
    return Path(os.environ.get("FEDAGG_CACHE") or Path.home() / ".cache" / "fedagg").expanduser()


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


def _torchvision_how(cls: type, folder: Path) -> str:
    return (
        f"on a machine with network run python -c \"import torchvision; torchvision.datasets.{cls.__name__}"
        f"('DIR', download=True)\" and copy DIR/{folder.name} to {folder} "
        f"(or set data.root to a folder that holds {folder.name}/)"
    )


def _from_hwc(array: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).permute(0, 3, 1, 2).contiguous()


def _labels(values) -> Tensor:
    return torch.as_tensor(np.asarray(values), dtype=torch.int64)


# --- scikit-learn digits ----------------------------------------------------------------


def digits(root: str | None = None, *, mean: Sequence[float], std: Sequence[float], augment: bool = False,
           download: bool = False) -> DatasetBundle:
    """scikit-learn's bundled 1x8x8 digits (1,797 images); `root` is ignored.

    The pixel values 0..16 become round(v * 255 / 16) so every dataset shares the uint8
    pipeline; the split is fixed (stratified 80/20, random_state 0) so results compare
    across runs and machines.
    """
    del root, download  # bundled with scikit-learn
    cached = cache_dir() / "digits-split-v1.pt"  # importing scikit-learn takes seconds; the split never changes
    if cached.exists():
        t = torch.load(cached)
    else:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        data = load_digits()
        images = np.rint(data.images * (255 / 16)).astype(np.uint8)[:, None]
        x_tr, x_te, y_tr, y_te = train_test_split(images, data.target, test_size=0.2, stratify=data.target,
                                                  random_state=0)
        t = {"train_x": torch.from_numpy(x_tr).contiguous(), "train_y": _labels(y_tr),
             "test_x": torch.from_numpy(x_te).contiguous(), "test_y": _labels(y_te)}
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
        torch.save(t, tmp)
        os.replace(tmp, cached)  # concurrent runs each write whole files
    return DatasetBundle("digits", t["train_x"], t["train_y"], t["test_x"], t["test_y"], 10, mean, std, augment)


# --- MNIST and Fashion-MNIST (IDX files) ------------------------------------------------


def _gzip_size(path: Path) -> int:
    # gzip stores the uncompressed length (mod 2**32) in its last four bytes.
    with open(path, "rb") as f:
        f.seek(-4, os.SEEK_END)
        return int.from_bytes(f.read(4), "little")


def _extracted(path: Path, gz: Path) -> bool:
    return path.is_file() and (not gz.is_file() or path.stat().st_size % 2**32 == _gzip_size(gz))


def _writable(folder: Path) -> bool:
    # root passes os.access on any folder, so a folder with no write bit at all (a shared,
    # deliberately read-only copy) counts as read-only too.
    return os.access(folder, os.W_OK) and bool(folder.stat().st_mode & 0o222)


def _idx_root(cls: type, name: str, root: Path, download: bool) -> Path:
    """A folder X with X/<cls>/raw/<extracted IDX files>, as torchvision's reader requires.

    Copies often ship only the .gz files (torchvision extracts them on download); these
    are extracted next to themselves, or into the cache when the data folder is read-only.
    """
    raw = root / cls.__name__ / "raw"
    names = [os.path.splitext(os.path.basename(url))[0] for url, _ in cls.resources]
    expected = [f"{n} (or {n}.gz)" for n in names]
    missing = lambda: [n for n in names if not (raw / n).is_file() and not (raw / f"{n}.gz").is_file()]  # noqa: E731
    how = _torchvision_how(cls, root / cls.__name__)
    if download and missing():
        fetch(name, root, how, lambda: not missing())
    if missing():
        raise _not_found(name, raw, expected, how, missing())
    if all(_extracted(raw / n, raw / f"{n}.gz") for n in names):
        return root

    target = raw if _writable(raw) else cache_dir() / cls.__name__ / "raw"
    target.mkdir(parents=True, exist_ok=True)
    for n in names:
        gz = raw / f"{n}.gz"
        if _extracted(target / n, gz):
            continue
        # Extract (or copy) beside the destination, then rename: concurrent runs and
        # interrupted ones never see a half-written file.
        from torchvision.datasets.utils import extract_archive

        scratch = Path(tempfile.mkdtemp(dir=target, prefix=".extract-"))
        try:
            if gz.is_file():
                extract_archive(str(gz), str(scratch))
            else:
                shutil.copyfile(raw / n, scratch / n)
            os.replace(scratch / n, target / n)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target.parent.parent


def _idx_dataset(cls: type, name: str, root: str, mean, std, augment: bool, download: bool) -> DatasetBundle:
    base = str(_idx_root(cls, name, Path(root).expanduser().resolve(), download))
    train, test = cls(base, train=True, download=False), cls(base, train=False, download=False)
    return DatasetBundle(
        name, train.data.unsqueeze(1).contiguous(), train.targets.long(), test.data.unsqueeze(1).contiguous(),
        test.targets.long(), len(cls.classes), mean, std, augment,
    )


def mnist(root: str, *, mean: Sequence[float], std: Sequence[float], augment: bool = False,
          download: bool = False) -> DatasetBundle:
    """MNIST 1x28x28 from `root/MNIST/raw/` (torchvision's layout, plain or .gz IDX files)."""
    return _idx_dataset(_tv().MNIST, "mnist", root, mean, std, augment, download)


def fmnist(root: str, *, mean: Sequence[float], std: Sequence[float], augment: bool = False,
           download: bool = False) -> DatasetBundle:
    """Fashion-MNIST 1x28x28 from `root/FashionMNIST/raw/` (plain or .gz IDX files)."""
    return _idx_dataset(_tv().FashionMNIST, "fmnist", root, mean, std, augment, download)


# --- CIFAR (pickled batches) --------------------------------------------------------------


def _without_md5(cls: type) -> type:
    # torchvision's reader minus the checksums: already verified, or the user opted out (tests
    # write tiny files in the genuine format, which cannot match the official checksums).
    return type(cls.__name__, (cls,), {
        "train_list": [[f, None] for f, _ in cls.train_list],
        "test_list": [[f, None] for f, _ in cls.test_list],
        "meta": {**cls.meta, "md5": None},
    })


def _cifar(cls: type, name: str, root: str, mean, std, augment: bool, verify_md5: bool, download: bool) -> DatasetBundle:
    root_path = Path(root).expanduser().resolve()
    folder = root_path / cls.base_folder
    expected = [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    _require(name, folder, expected, _torchvision_how(cls, folder), download=download)
    try:
        # torchvision's md5 check covers every batch and the meta file in one pass.
        train = (cls if verify_md5 else _without_md5(cls))(str(root_path), train=True, download=False)
    except RuntimeError as err:
        raise RuntimeError(
            f"{name}: the files in {folder} fail torchvision's md5 check, so they are damaged or not the "
            f"official release ({err}). Copy them again, or set dataset.verify_md5=false to load them anyway."
        ) from err
    test = _without_md5(cls)(str(root_path), train=False, download=False)
    return DatasetBundle(
        name, _from_hwc(train.data), _labels(train.targets), _from_hwc(test.data), _labels(test.targets),
        len(train.classes), mean, std, augment,
    )


def cifar10(root: str, *, mean: Sequence[float], std: Sequence[float], augment: bool = True,
            verify_md5: bool = True, download: bool = False) -> DatasetBundle:
    """CIFAR-10 3x32x32 from `root/cifar-10-batches-py/` (the python-pickle release)."""
    return _cifar(_tv().CIFAR10, "cifar10", root, mean, std, augment, verify_md5, download)


def cifar100(root: str, *, mean: Sequence[float], std: Sequence[float], augment: bool = True,
             verify_md5: bool = True, download: bool = False) -> DatasetBundle:
    """CIFAR-100 3x32x32, the 100 fine labels, from `root/cifar-100-python/`."""
    return _cifar(_tv().CIFAR100, "cifar100", root, mean, std, augment, verify_md5, download)
