"""Dataset loaders: real MNIST and digits, tiny fixtures in every other on-disk format."""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fedagg.data import image_folders
from fedagg.data.datasets import DatasetBundle, DatasetNotFoundError
from fedagg.data.files import DataError
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


def how(cls: str, folder: Path) -> str:
    return (f"on a machine with network run python -c \"import torchvision; torchvision.datasets.{cls}('DIR', "
            f"download=True)\" and copy DIR/{folder.name} to {folder} (or set data.root to a folder that holds "
            f"{folder.name}/)")


def test_cifar_md5_check_is_on_by_default(tmp_path):
    write_cifar(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    before = snapshot(folder)
    with pytest.raises(DataError) as err:
        load("cifar10", tmp_path)
    assert snapshot(folder) == before
    assert str(err.value) == (
        f"cifar10: data_batch_1, data_batch_2, data_batch_3, data_batch_4, data_batch_5, test_batch, batches.meta in "
        f"{folder} fail the official MD5 check (damaged, or not the official release); copy them again "
        f"({how('CIFAR10', folder)}), or set dataset.verify_md5=false to load them anyway")
    assert err.value.__cause__ is None and err.value.__context__ is None  # no second traceback behind it


@pytest.mark.parametrize("junk, why", [
    (b"not a pickle\n", "UnpicklingError: invalid load key, 'n'."),
    (pickle.dumps({"batch_label": "x"}, protocol=2), "not the pickled dict with data, labels it should be"),
])
def test_unreadable_cifar_batch_is_named_in_one_line(tmp_path, junk, why):
    write_cifar(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    (folder / "data_batch_3").write_bytes(junk)
    with pytest.raises(DataError) as err:
        load("cifar10", tmp_path, verify_md5=False)
    assert str(err.value) == f"cifar10: cannot read data_batch_3 ({why}) in {folder}; copy it again ({how('CIFAR10', folder)})"
    assert (folder / "data_batch_3").read_bytes() == junk


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("name", ["mnist", "cifar10", "tinyimagenet", "imagenet"])
def test_a_data_root_that_is_a_file_is_one_line(tmp_path, name):
    (tmp_path / "data").write_text("the user's file")
    rule = "data.root must be a folder (one that holds the datasets, or where they can be downloaded)"
    with pytest.raises(DataError) as err:
        load(name, tmp_path / "data", download=True)
    assert str(err.value) == f"data.root={tmp_path / 'data'} is a file; {rule}"
    with pytest.raises(DataError) as err:
        load(name, tmp_path / "data" / "sub", download=True)
    assert str(err.value) == f"data.root={tmp_path / 'data' / 'sub'} is inside {tmp_path / 'data'}, which is a file; {rule}"
    assert snapshot(tmp_path) == {"data": b"the user's file"}  # nothing created, the file untouched


@pytest.mark.parametrize("cut, why", [
    (20, "EOFError: Compressed file ended before the end-of-stream marker was reached"),
    (0, "BadGzipFile: Not a gzipped file (b'ju')"),
])
def test_a_damaged_gz_is_named_and_kept_when_downloads_are_off(tmp_path, cut, why):
    write_fashion_mnist(tmp_path / "data")
    gz = tmp_path / "data" / "FashionMNIST" / "raw" / "train-labels-idx1-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:cut] if cut else b"junk, not gzip")
    before = snapshot(gz.parent)
    with pytest.raises(DataError) as err:
        load("fmnist", tmp_path / "data", download=False)
    assert str(err.value) == (f"fmnist: {gz} is damaged ({why}); replace it with a good copy "
                              f"({how('FashionMNIST', tmp_path / 'data' / 'FashionMNIST')}), or set data.download=true "
                              f"to download it again")
    after = snapshot(gz.parent)  # the damaged file is the user's to replace; only the extracted images were added
    assert {k: v for k, v in after.items() if k in before} == before and set(after) - set(before) == {"train-images-idx3-ubyte"}


def test_an_idx_file_cut_short_before_compression_is_named(tmp_path):
    import gzip

    write_fashion_mnist(tmp_path / "data")
    raw = tmp_path / "data" / "FashionMNIST" / "raw"
    gz = raw / "train-images-idx3-ubyte.gz"
    gz.write_bytes(gzip.compress(gzip.decompress(gz.read_bytes())[:1000]))  # a valid .gz of too few bytes
    with pytest.raises(DataError) as err:
        load("fmnist", tmp_path / "data")
    assert str(err.value) == (f"fmnist: {raw / 'train-images-idx3-ubyte'} holds 1000 bytes where its header announces "
                              f"{16 + 12 * 28 * 28}; replace it (and its .gz) with a good copy "
                              f"({how('FashionMNIST', tmp_path / 'data' / 'FashionMNIST')})")


def test_a_cache_that_is_a_file_costs_the_digits_only_their_cache(tmp_path, monkeypatch, caplog):
    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING):
        b = load("digits", None)
    assert (len(b.train_y), len(b.test_y)) == (1437, 360)
    assert caplog.messages == [f"FEDAGG_CACHE={tmp_path / 'cache'} cannot be used ({tmp_path / 'cache'} is a file); "
                               "set FEDAGG_CACHE to a folder fedagg can write (or unset it for ~/.cache/fedagg); "
                               "the digits split is not cached"]
    assert (tmp_path / "cache").read_text() == "not a folder"


def test_a_cache_that_is_a_file_is_named_when_read_only_data_needs_it(tmp_path, monkeypatch):
    write_fashion_mnist(tmp_path / "data")
    raw = tmp_path / "data" / "FashionMNIST" / "raw"
    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache" / "sub"))
    raw.chmod(0o555)
    try:
        with pytest.raises(DataError) as err:
            load("fmnist", tmp_path / "data")
    finally:
        raw.chmod(0o755)
    assert str(err.value) == (f"FEDAGG_CACHE={tmp_path / 'cache' / 'sub'} cannot be used ({tmp_path / 'cache'} is a "
                              "file); set FEDAGG_CACHE to a folder fedagg can write (or unset it for ~/.cache/fedagg)")


def test_a_damaged_digits_cache_is_written_again(private_cache, caplog):
    private_cache.mkdir()
    (private_cache / "digits-split-v1.pt").write_bytes(b"half a file")
    with caplog.at_level(logging.WARNING):
        b = load("digits", None)
    assert (len(b.train_y), len(b.test_y)) == (1437, 360)
    assert caplog.messages[0].startswith(f"ignoring unreadable cache {private_cache / 'digits-split-v1.pt'} (")
    assert torch.equal(torch.load(private_cache / "digits-split-v1.pt")["test_y"], b.test_y)  # a good copy again


@pytest.mark.slow  # a CLI sweep or several subprocess runs: ~8-10 s on 2 idle cores
def test_a_data_error_on_the_command_line_is_one_line_exit_2(tmp_path):
    (tmp_path / "data").write_text("the user's file")
    proc = subprocess.run([sys.executable, "-m", "fedagg.run", "dataset=mnist", f"data.root={tmp_path / 'data'}",
                           "rounds=1", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
                          env=dict(os.environ, FEDAGG_CACHE=str(tmp_path / "cache")))
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, lines
    assert lines[0].endswith(f"[fedagg][ERROR] - data.root={tmp_path / 'data'} is a file; data.root must be a folder "
                             "(one that holds the datasets, or where they can be downloaded)")
    assert (tmp_path / "data").read_text() == "the user's file"


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
