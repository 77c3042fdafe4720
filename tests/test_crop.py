"""`dataset.crop` (Reddi et al. 2021's TFF pipeline for CIFAR, facts D of
../shared/papers/fedopt-fedprox-settings.md): training images are a random crop x crop window
(no padding) with a random flip, test images their central window; the model is built for crop x crop;
both engines serve the same crops."""

from types import SimpleNamespace

import pytest
import torch

from fedagg.clients.client import ClientData
from fedagg.clients.trainer import LocalSGD
from fedagg.data.datasets import DatasetBundle
from fedagg.data.device import DeviceData, draw_crop_flip, random_crop_flip
from fedagg.engines.base import RoundJob
from fedagg.engines.parallel import ParallelEngine
from fedagg.engines.sequential import SequentialEngine
from fedagg.models.flat import get_buffers, get_params
from fedagg.models.simple import MLP


def _bundle(crop, n=20, size=32, channels=3):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, channels, size, size), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return DatasetBundle("toy", x, y, x.clone(), y.clone(), 10, (0.5,) * channels, (0.25,) * channels, True, crop=crop)


def test_crop_sets_the_image_size_the_model_is_built_for():
    assert _bundle(24).image_size == 24 and _bundle(None).image_size == 32


def test_test_images_are_their_central_window():
    data = DeviceData(_bundle(24), torch.device("cpu"), (3, 24, 24))
    x, _ = next(data.eval_batches(None, batch_size=5))
    raw = data.test_x[:5].float() / 255
    assert x.shape == (5, 3, 24, 24)
    torch.testing.assert_close(x, (raw[..., 4:28, 4:28] - 0.5) / 0.25)  # offset (32 - 24) // 2 = 4


def test_training_crops_are_unpadded_windows_maybe_flipped():
    x = torch.rand(32, 3, 32, 32)
    out = random_crop_flip(x, torch.Generator().manual_seed(1), crop=24)
    assert out.shape == (32, 3, 24, 24)
    offsets, flips = set(), 0
    for i in range(32):
        hits = [(dy, dx, f) for dy in range(9) for dx in range(9) for f in (False, True)
                if torch.equal(out[i], (lambda w: w.flip(-1) if f else w)(x[i, :, dy:dy + 24, dx:dx + 24]))]
        assert len(hits) == 1  # inside the image: no zero padding
        offsets.add(hits[0][:2])
        flips += hits[0][2]
    assert len(offsets) > 8 and 0 < flips < 32


def test_a_24_crop_of_32_draws_what_the_padded_crop_draws():
    # the same span (9 offsets) from the same stream: turning the crop on changes no other draw of a run
    a = draw_crop_flip(6, torch.Generator().manual_seed(3), torch.device("cpu"))
    b = draw_crop_flip(6, torch.Generator().manual_seed(3), torch.device("cpu"), span=32 - 24 + 1)
    assert all(torch.equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("crop", [0, 33, 24.0, True])
def test_bad_crop_names_key_value_and_range(crop):
    with pytest.raises(ValueError) as err:
        _bundle(crop)
    assert str(err.value) == (f"dataset.crop={crop!r} is not allowed; use null or a side in 1..32 "
                              f"(the images are 32x32; Reddi et al. crop CIFAR to 24)")


def test_both_engines_train_on_the_same_crops():
    bundle = _bundle(6, n=30, size=8, channels=1)
    torch.manual_seed(0)
    model = MLP(num_classes=10, in_channels=1, image_size=bundle.image_size)
    assert model.input_shape == (1, 6, 6)
    data = DeviceData(bundle, torch.device("cpu"), model.input_shape)
    perm = torch.randperm(30, generator=torch.Generator().manual_seed(1))
    clients = [ClientData(3, perm[:11], perm[11:13]), ClientData(7, perm[13:30], perm[28:30])]
    start = get_params(model), get_buffers(model)
    kw = dict(lr=0.05, momentum=0.9, batch_size=4, local_epochs=2)
    out = []
    for engine in (SequentialEngine(), ParallelEngine()):
        job = RoundJob(model, LocalSGD(**kw), data, clients, start[0].clone(), start[1].clone(), lr=kw["lr"], seed=3, round=1)
        out.append(engine.train_round(job))
    torch.testing.assert_close(out[1].params, out[0].params, rtol=1e-5, atol=1e-6)
    # and the crop matters: the same training without it (images padded and shifted) ends elsewhere
    plain = SimpleNamespace(**{**vars(bundle), "crop": None})
    data2 = DeviceData(plain, torch.device("cpu"), (1, 6, 6))  # resized from 8x8 to the model's 6x6
    job = RoundJob(model, LocalSGD(**kw), data2, clients, start[0].clone(), start[1].clone(), lr=kw["lr"], seed=3, round=1)
    assert not torch.allclose(SequentialEngine().train_round(job).params, out[0].params)
