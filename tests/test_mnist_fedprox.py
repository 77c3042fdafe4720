"""dataset=mnist_fedprox: FedProx's MNIST devices (litian96/FedProx@d2a4501 data/mnist/generate_niid.py:20-80),
checked by exact properties on small fake MNIST files: each device's digits, its first 10 images, the shares, the
90/10 split per device and the per-pixel standardisation (a numpy transcription of lines 20-22)."""

import numpy as np
import pytest
import torch

from fake_datasets import write_idx_gz
from fedagg.data.mnist_fedprox import fedprox_devices, mnist_fedprox
from fedagg.seeding import generator

TRAIN, TEST = 250, 50  # 25 + 5 images of each digit: 30 a digit


def write_mnist(root):
    """Labels i % 10 in file order; pixels 0 and 1 hold the image's number i (training files first)."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (TRAIN + TEST, 28, 28), dtype=np.uint8)
    i = np.arange(TRAIN + TEST)
    images[:, 0, 0], images[:, 0, 1] = i % 256, i // 256
    labels = (i % 10).astype(np.uint8)
    for prefix, part in (("train", slice(0, TRAIN)), ("t10k", slice(TRAIN, None))):
        write_idx_gz(raw / f"{prefix}-images-idx3-ubyte.gz", images[part])
        write_idx_gz(raw / f"{prefix}-labels-idx1-ubyte.gz", labels[part])
    return images.reshape(-1, 784), labels


def test_each_device_starts_with_5_images_of_each_of_its_2_digits_and_keeps_to_them():
    labels = torch.arange(300) % 10
    devices = fedprox_devices(labels, num_devices=10, g=generator(0, "t"))
    taken = torch.cat(devices)
    assert len(set(taken.tolist())) == len(taken)  # disjoint
    for u, rows in enumerate(devices):
        digits = (u % 10, (u + 1) % 10)
        assert labels[rows[:5]].tolist() == [digits[0]] * 5 and labels[rows[5:10]].tolist() == [digits[1]] * 5
        assert set(labels[rows].tolist()) == set(digits)
    # digit 0 serves device 0 (j = 0), then device 9 (j = 1): its first ten images in file order, 5 and 5
    assert devices[0][:5].tolist() == [0, 10, 20, 30, 40] and devices[9][5:10].tolist() == [50, 60, 70, 80, 90]
    # the shares: each digit's 20 remaining images go out in 2 truncated shares, less than 1 image lost to each
    for d in range(10):
        assert 30 - 2 <= int((labels[taken] == d).sum()) <= 30


def test_equal_weights_give_the_authors_sizes_by_hand():
    """sigma = 0: every weight 1, so each digit's 20 remaining images are 2 shares of 10. Digit d >= 1 serves
    device d - 1 (j = 1) first: 10 + 10 < 30, taken; then device d (j = 0): 20 + 10 = 30 is not < 30, so the
    authors' test skips it. Digit 0 serves device 0 first, device 9's share is skipped."""
    devices = fedprox_devices(torch.arange(300) % 10, num_devices=10, sigma=0.0, g=generator(0, "t"))
    assert [len(r) for r in devices] == [30] + [20] * 8 + [10]


def test_the_dataset_standardises_per_pixel_and_splits_each_device_90_10(tmp_path):
    images, labels = write_mnist(tmp_path)
    bundle = mnist_fedprox(str(tmp_path), num_devices=10, sigma=0.0)
    # generate_niid.py:20-22, transcribed
    data = images.astype(np.float32)
    mu, sigma = np.mean(data, 0), np.std(data, 0)
    expected = (data - mu) / (sigma + 0.001)
    assert bundle.inputs == "vectors" and bundle.train_x.shape[1:] == (784, 1, 1) and bundle.num_classes == 10
    sizes = {"train": [], "test": []}
    for split in ("train", "test"):
        x, y, owner = (getattr(bundle, f"{split}_{k}") for k in ("x", "y", "owner"))
        x = x.view(-1, 784).numpy()
        number = np.rint(x[:, 0] * (sigma[0] + 0.001) + mu[0]) + 256 * np.rint(x[:, 1] * (sigma[1] + 0.001) + mu[1])
        number = number.astype(np.int64)  # the image each sample is (pixels 0 and 1)
        assert np.allclose(x, expected[number], rtol=0, atol=1e-5)
        assert (y.numpy() == labels[number]).all()
        for u in range(10):
            mine = owner.numpy() == u
            sizes[split].append(int(mine.sum()))
            assert set(y[mine].tolist()) <= {u % 10, (u + 1) % 10}
    n = [30] + [20] * 8 + [10]
    assert sizes["train"] == [int(0.9 * k) for k in n] == [27] + [18] * 8 + [9]  # train_len = int(0.9 n)
    assert sizes["test"] == [k - int(0.9 * k) for k in n]


def test_a_device_count_that_is_not_a_multiple_of_ten_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"^dataset.num_devices=15 is not allowed; it must be a multiple of 10"):
        mnist_fedprox(str(tmp_path), num_devices=15)
