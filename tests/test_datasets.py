"""Dataset loaders: real MNIST and digits, tiny fixtures in every other on-disk format."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fedagg.data import image_folders
from fedagg.data.datasets import DatasetBundle, DatasetNotFoundError
from fake_datasets import write_cifar, write_fashion_mnist, write_imagenet, write_tiny_imagenet

CONF = Path(__file__).resolve().parents[1] / "conf" / "dataset"
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
NAMES = ["digits", "mnist", "fmnist", "cifar10", "cifar100", "tinyimagenet", "imagenet"]


def load(name: str, root, **overrides) -> DatasetBundle:
    """Through the YAML, as `fedagg.run` does, so the configs are tested with the code."""
    return instantiate(OmegaConf.load(CONF / f"{name}.yaml"), **overrides)(root=str(root))


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def check_bundle(b: DatasetBundle, channels: int, size: int) -> None:
    for x, y in ((b.train_x, b.train_y), (b.test_x, b.test_y)):
        assert x.dtype == torch.uint8 and x.is_contiguous() and x.device.type == "cpu"
        assert x.shape[1:] == (channels, size, size) and y.dtype == torch.int64 and len(x) == len(y)
        assert 0 <= int(y.min()) and int(y.max()) < b.num_classes
    assert (b.in_channels, b.image_size) == (channels, size)
    assert len(b.mean) == len(b.std) == channels and all(isinstance(v, float) for v in b.mean + b.std)


@pytest.mark.parametrize("name", NAMES)
def test_yaml_targets_the_loader_of_the_same_name(name):
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    module = "jpeg_datasets" if name in ("tinyimagenet", "imagenet") else "datasets"
    assert cfg._target_ == f"fedagg.data.{module}.{name}" and cfg._partial_ is True


def test_digits_fixed_stratified_split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    target = data.target
    b = load("digits", "/nonexistent")  # root is ignored
    check_bundle(b, 1, 8)
    assert b.name == "digits" and b.num_classes == 10 and not b.augment
    n_test = int(np.ceil(0.2 * len(target)))
    assert (len(b.train_y), len(b.test_y)) == (len(target) - n_test, n_test) == (1437, 360)
    assert int(b.train_x.max()) == 255 and int(b.train_x.min()) == 0
    counts = np.bincount(target, minlength=10)
    assert torch.equal(torch.bincount(b.train_y, minlength=10) + torch.bincount(b.test_y, minlength=10),
                       torch.as_tensor(counts))
    # stratified: every class keeps ~20% of its images for testing
    assert np.all(np.abs(torch.bincount(b.test_y, minlength=10).numpy() - 0.2 * counts) <= 1)
    # the split the spec fixes: stratified 20% test, random_state 0, values round(v * 255 / 16)
    x_tr, x_te, y_tr, y_te = train_test_split(data.images, target, test_size=0.2, stratify=target, random_state=0)
    assert b.train_y.tolist() == y_tr.tolist() and b.test_y.tolist() == y_te.tolist()
    assert torch.equal(b.test_x[:, 0], torch.from_numpy(np.floor(x_te * 255 / 16 + 0.5).astype(np.uint8)))
    again = load("digits", None)
    assert torch.equal(b.train_x, again.train_x) and torch.equal(b.test_y, again.test_y)
    x = b.train_x.double() / 255  # the YAML's numbers are these statistics
    assert b.mean[0] == pytest.approx(x.mean().item(), abs=1e-4) and b.std[0] == pytest.approx(x.std().item(), abs=1e-3)


@pytest.mark.skipif(not (SHARED_DATA / "MNIST" / "raw").is_dir(), reason="no shared MNIST copy on this machine")
def test_mnist_from_read_only_gz_files(private_cache):
    raw = SHARED_DATA / "MNIST" / "raw"
    before = sorted(os.listdir(raw))
    b = load("mnist", SHARED_DATA)
    check_bundle(b, 1, 28)
    assert (len(b.train_y), len(b.test_y), b.num_classes) == (60000, 10000, 10)
    assert int(b.train_y[0]) == 5  # the canonical first MNIST label
    assert torch.bincount(b.train_y).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert torch.bincount(b.test_y).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert sorted(os.listdir(raw)) == before  # extracted into the cache, not beside the .gz
    assert (private_cache / "MNIST" / "raw" / "train-images-idx3-ubyte").stat().st_size == 60000 * 784 + 16


def test_fashion_mnist_idx_gz_extracted_in_place(tmp_path):
    want = write_fashion_mnist(tmp_path / "data")
    b = load("fmnist", tmp_path / "data")
    check_bundle(b, 1, 28)
    assert b.name == "fmnist" and b.num_classes == 10
    assert torch.equal(b.train_x[:, 0], torch.from_numpy(want["train_x"]))
    assert torch.equal(b.test_x[:, 0], torch.from_numpy(want["test_x"]))
    assert b.train_y.tolist() == want["train_y"].tolist() and b.test_y.tolist() == want["test_y"].tolist()
    assert (tmp_path / "data" / "FashionMNIST" / "raw" / "t10k-images-idx3-ubyte").is_file()


def test_fashion_mnist_read_only_folder_extracts_into_cache(tmp_path, private_cache):
    want = write_fashion_mnist(tmp_path / "data", seed=1)
    raw = tmp_path / "data" / "FashionMNIST" / "raw"
    raw.chmod(0o555)
    try:
        b = load("fmnist", tmp_path / "data")
    finally:
        raw.chmod(0o755)
    assert torch.equal(b.train_x[:, 0], torch.from_numpy(want["train_x"]))
    assert not (raw / "train-images-idx3-ubyte").exists()
    assert (private_cache / "FashionMNIST" / "raw" / "train-images-idx3-ubyte").is_file()


@pytest.mark.parametrize("name,hundred", [("cifar10", False), ("cifar100", True)])
def test_cifar_pickles_pixel_exact(tmp_path, name, hundred):
    want = write_cifar(tmp_path, hundred=hundred)
    b = load(name, tmp_path, verify_md5=False)
    check_bundle(b, 3, 32)
    assert b.name == name and b.augment and b.num_classes == (100 if hundred else 10)
    assert len(b.train_y) == (4 if hundred else 20) and len(b.test_y) == 4
    assert torch.equal(b.train_x, torch.from_numpy(want["train_x"]))
    assert torch.equal(b.test_x, torch.from_numpy(want["test_x"]))
    assert b.train_y.tolist() == want["train_y"].tolist() and b.test_y.tolist() == want["test_y"].tolist()


def test_cifar_md5_check_is_on_by_default(tmp_path):
    write_cifar(tmp_path)
    with pytest.raises(RuntimeError, match="md5.*verify_md5=false"):
        load("cifar10", tmp_path)


def assert_colors(x: torch.Tensor, colors: list) -> None:
    # JPEG of a solid colour decodes to within a few levels of it
    want = torch.tensor(colors, dtype=torch.int16).view(-1, 3, 1, 1)
    assert (x.to(torch.int16) - want).abs().max() <= 4


def test_tiny_imagenet_official_layout(tmp_path):
    want = write_tiny_imagenet(tmp_path)
    b = load("tinyimagenet", tmp_path)
    check_bundle(b, 3, 64)
    assert b.name == "tinyimagenet" and b.num_classes == 2 and b.augment
    assert b.train_y.tolist() == want["train_y"] and b.test_y.tolist() == want["test_y"]
    assert_colors(b.train_x, want["train_colors"])
    assert_colors(b.test_x, want["test_colors"])


def test_folder_cache_is_reused_and_invalidated(tmp_path, private_cache, monkeypatch):
    want = write_tiny_imagenet(tmp_path)
    first = load("tinyimagenet", tmp_path)
    cached = list(private_cache.glob("tinyimagenet-64px-*.pt"))
    assert len(cached) == 1

    def no_decoding(*args):
        raise AssertionError("decoded although the cache was valid")

    with monkeypatch.context() as m:
        m.setattr(image_folders, "decode_image", no_decoding)
        second = load("tinyimagenet", tmp_path)
    for key in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(first, key), getattr(second, key))

    # another size is another cache file; a new image makes the old one stale
    assert load("tinyimagenet", tmp_path, image_size=32).train_x.shape[1:] == (3, 32, 32)
    assert len(list(private_cache.glob("tinyimagenet-*px-*.pt"))) == 2
    extra = tmp_path / "tiny-imagenet-200" / "train" / "n09999999" / "images" / "n09999999_9.JPEG"
    extra.write_bytes((tmp_path / "tiny-imagenet-200" / "val" / "images" / "val_0.JPEG").read_bytes())
    third = load("tinyimagenet", tmp_path)
    assert len(third.train_y) == len(want["train_y"]) + 1 and third.train_y[-1] == 1
    assert_colors(third.train_x[-1:], [(250, 10, 10)])


def test_imagenet_folder_resized_and_centre_cropped(tmp_path):
    want = write_imagenet(tmp_path)
    b = load("imagenet", tmp_path, image_size=16)
    check_bundle(b, 3, 16)
    assert b.name == "imagenet" and b.num_classes == 2 and b.augment
    assert b.train_y.tolist() == want["train_y"] and b.test_y.tolist() == want["test_y"]
    # every image is a centred white square between black bars: a squash instead of a
    # crop would leave dark columns or rows at the edges
    for x in (b.train_x, b.test_x):
        assert x[:, :, 2:14, 2:14].min() >= 235
        assert x.float().mean(dim=(1, 2, 3)).min() >= 200


MISSING = [
    ("mnist", "MNIST/raw", "train-images-idx3-ubyte"),
    ("fmnist", "FashionMNIST/raw", "t10k-labels-idx1-ubyte"),
    ("cifar10", "cifar-10-batches-py", "data_batch_1"),
    ("cifar100", "cifar-100-python", "meta"),
    ("tinyimagenet", "tiny-imagenet-200", "val_annotations.txt"),
    ("imagenet", "imagenet", "train/<wnid>/*.JPEG"),
]


@pytest.mark.parametrize("name,folder,expected", MISSING)
def test_missing_dataset_says_where_and_what(tmp_path, name, folder, expected):
    with pytest.raises(DatasetNotFoundError) as err:
        load(name, tmp_path)
    message = str(err.value)
    assert str((tmp_path / folder).resolve()) in message and expected in message
    assert "to provide" in message
    assert isinstance(err.value, FileNotFoundError)


def test_partly_missing_cifar_names_the_missing_file(tmp_path):
    write_cifar(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DatasetNotFoundError, match="missing data_batch_3"):
        load("cifar10", tmp_path, verify_md5=False)


def test_empty_image_folder_is_not_found(tmp_path):
    (tmp_path / "imagenet" / "train" / "n01440764").mkdir(parents=True)
    (tmp_path / "imagenet" / "val").mkdir(parents=True)
    with pytest.raises(DatasetNotFoundError, match="no images under train"):
        load("imagenet", tmp_path)
