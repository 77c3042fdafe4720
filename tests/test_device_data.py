"""Batches prepared on the device: normalisation, CIFAR augmentation, input adaptation."""

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from fedagg.data.device import DeviceData, random_crop_flip


def _bundle(channels=1, size=4, n=6, augment=False):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, channels, size, size), dtype=torch.uint8, generator=g)
    y = torch.arange(n) % 3
    return SimpleNamespace(name="toy", num_classes=3, augment=augment, train_x=x, train_y=y, test_x=x, test_y=y,
                           mean=(0.5,) * channels, std=(0.25,) * channels)


def test_normalisation_uses_dataset_mean_and_std():
    b = _bundle()
    data = DeviceData(b, torch.device("cpu"), (1, 4, 4))
    x, y = data.train_batch(torch.tensor([2, 0]))
    expected = (b.train_x[[2, 0]].float() / 255 - 0.5) / 0.25
    assert torch.allclose(x, expected) and torch.equal(y, b.train_y[[2, 0]])


def test_grey_images_are_resized_and_repeated_for_rgb_models():
    data = DeviceData(_bundle(size=28), torch.device("cpu"), (3, 32, 32))
    x, _ = data.train_batch(torch.tensor([0, 1]))
    assert x.shape == (2, 3, 32, 32)
    assert torch.equal(x[:, 0], x[:, 1]) and torch.equal(x[:, 1], x[:, 2])
    single = (data.train_x[:2].float() / 255 - 0.5) / 0.25
    assert torch.allclose(x[:, :1], F.interpolate(single, size=(32, 32), mode="bilinear", align_corners=False))


def test_every_augmented_image_is_a_padded_shift_maybe_flipped():
    x = torch.rand(16, 3, 8, 8)
    out = random_crop_flip(x, torch.Generator().manual_seed(1))
    padded = F.pad(x, (4, 4, 4, 4))
    flips = 0
    for i in range(16):
        crops = [padded[i, :, dy : dy + 8, dx : dx + 8] for dy in range(9) for dx in range(9)]
        plain = any(torch.equal(out[i], c) for c in crops)
        flipped = any(torch.equal(out[i], c.flip(-1)) for c in crops)
        assert plain or flipped
        flips += flipped and not plain
    assert 0 < flips < 16  # both outcomes occur: the flip is random, not always or never


def test_augmentation_is_reproducible_from_its_generator():
    x = torch.rand(4, 3, 8, 8)
    a = random_crop_flip(x, torch.Generator().manual_seed(5))
    b = random_crop_flip(x, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


def test_eval_batches_cover_the_test_set_without_augmentation():
    data = DeviceData(_bundle(n=7, augment=True), torch.device("cpu"), (1, 4, 4))
    ys = torch.cat([y for _, y in data.eval_batches(None, batch_size=3)])
    assert torch.equal(ys, data.test_y)
    x0 = next(data.eval_batches(None, batch_size=3))[0]
    assert torch.allclose(x0, (data.test_x[:3].float() / 255 - 0.5) / 0.25)
