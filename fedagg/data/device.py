"""Device-resident data: uint8 images on the run's device, batches gathered by index.

Every batch is gathered, augmented (CIFAR-style random crop with padding 4 and a
horizontal flip; with a dataset's `crop: S`, a random S x S crop without padding and the flip,
test images cropped at their centre, as Reddi et al.'s TFF pipeline crops CIFAR to 24x24), normalised and adapted to the backbone's input shape (resize, grey to
RGB) on the device, so no DataLoader workers or per-sample host work sit in the training
path (DESIGN principle 6).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

CROP_PADDING = 4


DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    if name not in DEVICES:
        raise ValueError(f"device={name!r} is not allowed; choose one of {', '.join(DEVICES)}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but torch sees no CUDA device; use device=auto or device=cpu")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


_held: list[weakref.ref] = []  # the data tensors the process's runs hold on their devices


def shared(t: Tensor) -> Tensor:
    """`t`, or an equal tensor a run of this process already holds on the same device. The runs of a stacked
    sweep (fedagg.loop.drivers.run_in_step) so keep one copy of a dataset, and the parallel engine serves all
    their batches of a step with one gather. Data tensors are never written in place: a run that changes its data
    (a label attack, feature noise, a test subset) makes a new tensor of its own."""
    _held[:] = [ref for ref in _held if ref() is not None]
    for ref in _held:
        other = ref()
        if (other is not None and other.shape == t.shape and other.dtype == t.dtype and other.device == t.device
                and torch.equal(other, t)):
            return other
    _held.append(weakref.ref(t))
    return t


def inputs_key(data) -> tuple:
    """Equal for two datas that give a training index the same model input (the same images, noise and
    preparation): their batches can be gathered together."""
    if not isinstance(data, DeviceData):
        return ("data", id(data))
    return (id(data.train_x), id(data.train_noise), data.augment, data.crop, data.inputs, data.input_shape,
            data.normalisation)


def labels_key(data) -> tuple:
    """Equal for two datas whose training targets are the same tensor."""
    source = data.train_x if getattr(data, "inputs", "images") == "tokens" else data.train_y
    return ("targets", id(source))


KIND_WORDS = {"tokens": "token sequences", "vectors": "feature vectors"}  # INPUT_KINDS as a message says them


class DeviceData:
    def __init__(self, bundle, device: torch.device, input_shape: tuple[int, ...], model: str = "the model",
                 takes: str | None = None) -> None:
        """`input_shape`: what the model takes (one sample); `model`: how a refusal names it ("model LSTMShakespeare");
        `takes`: the kind of inputs the model is built for (a key of INPUT_KINDS), when only one kind fits it."""
        self.name = bundle.name
        self.num_classes = bundle.num_classes
        self.augment = bool(bundle.augment)
        self.crop = getattr(bundle, "crop", None)  # side of the square crop (train: random, test: central), or None
        self.inputs = getattr(bundle, "inputs", "images")  # DatasetBundle's INPUT_KINDS; plain namespaces are images
        if takes is not None and takes != self.inputs:  # its shape alone would say little ((80,) is a sequence length)
            raise ValueError(f"{model} takes {KIND_WORDS.get(takes, takes)}, but dataset {self.name!r} has "
                             f"{KIND_WORDS.get(self.inputs, self.inputs)} of shape {tuple(bundle.train_x.shape[1:])}; "
                             f"choose a model built for {self.inputs}")
        self.device = device
        self.train_x, self.train_y = shared(bundle.train_x.to(device)), shared(bundle.train_y.to(device))
        self.test_x, self.test_y = shared(bundle.test_x.to(device)), shared(bundle.test_y.to(device))
        # where clients' local test indices point: into the training pool (a share each client holds out), or
        # into the test set, for a dataset whose clients bring their own test split (partition=natural)
        self.local_tests = "train"
        self.input_shape = tuple(input_shape)
        self.train_noise: Tensor | None = None  # per training image, on the x / 255 scale; see add_feature_noise
        self.normalisation = (tuple(bundle.mean), tuple(bundle.std)) if self.inputs == "images" else ()
        if self.inputs != "images":  # features and token sequences are served as they are: the model must fit them
            given = tuple(self.prepare(self.train_x[:1]).shape[1:])
            if given != self.input_shape:
                raise ValueError(f"{model} needs inputs of shape {self.input_shape} but dataset {self.name!r} "
                                 f"has {self.inputs} of shape {given}; choose a model built for {self.inputs}")
            return
        if len(self.input_shape) != 3:
            shape = tuple(self.train_x.shape[1:])
            raise ValueError(f"{model} needs inputs of shape {self.input_shape} but dataset {self.name!r} has images "
                             f"of shape {shape}; choose a model built for images")
        channels = self.train_x.shape[1]
        self.mean = torch.tensor(bundle.mean, dtype=torch.float32, device=device).view(1, channels, 1, 1)
        self.std = torch.tensor(bundle.std, dtype=torch.float32, device=device).view(1, channels, 1, 1)
        want_c, want_h, want_w = input_shape
        if want_c != channels and channels != 1:
            raise ValueError(
                f"{model} needs {want_c}-channel input of shape {self.input_shape} but dataset {self.name!r} has "
                f"{channels} channels; only 1-channel images can be repeated to fit"
            )

    def add_feature_noise(self, parts: list[Tensor], sigma: float, seed: int) -> None:
        """NIID-Bench's feature skew (`partition.noise`): client i of N sees each of its images with Gaussian
        noise of standard deviation sigma * i / N in the normalised input space, drawn once per image from the
        client's own stream (in the order of its index tensor), so an image looks the same every epoch and in
        every engine. Kept on the device as float32, the size of the training images four times over."""
        from fedagg.seeding import generator

        if self.inputs != "images":
            raise ValueError(f"partition.noise is for images; dataset {self.name!r} has {self.inputs}")
        noise = torch.zeros(self.train_x.shape, dtype=torch.float32)
        for i, idx in enumerate(parts):
            scale = sigma * i / len(parts)
            if scale > 0 and idx.numel():
                z = torch.randn((idx.numel(), *self.train_x.shape[1:]), generator=generator(seed, "feature_noise", i))
                noise[idx.cpu()] = z * scale
        # noise n in the normalised space is n * std on the x / 255 scale: (x + n * std - mean) / std = x' + n
        self.train_noise = (noise.to(self.device) * self.std.view(1, -1, 1, 1)).contiguous()

    def train_images(self, idx: Tensor) -> Tensor:
        """Training samples `idx` as the clients see them: as stored, or images as float on the x / 255 scale
        with their noise."""
        if self.train_noise is None:
            return self.train_x[idx]
        return self.train_x[idx].float().div_(255.0).add_(self.train_noise[idx])

    def prepare(self, x: Tensor, *, augment: bool = False, generator: torch.Generator | None = None) -> Tensor:
        """Stored samples [B, ...] -> the model's input: uint8 images (or float on the x / 255 scale, from
        train_images) -> normalised float of the model's shape; vectors as they are; token rows [B, T + 1] ->
        their first T tokens as int64; text [B, T] as it is."""
        if self.inputs == "tokens":
            return x[..., :-1].long()
        if self.inputs in ("vectors", "text"):
            return x
        x = x.float().div_(255.0) if x.dtype == torch.uint8 else x
        if augment:
            x = random_crop_flip(x, generator, self.crop)
        x = center_crop(x, self.crop)  # test images; training ones arrive cropped already
        x = (x - self.mean) / self.std
        c, h, w = self.input_shape
        if x.shape[-2:] != (h, w):
            x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)
        if x.shape[1] != c:
            x = x.expand(-1, c, -1, -1)
        return x

    def train_batch(self, idx: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        x = self.prepare(self.train_images(idx), augment=self.augment, generator=generator)
        return x, targets(self, "train", idx)

    def eval_batches(self, idx: Tensor | None, batch_size: int, split: str = "test") -> Iterator[tuple[Tensor, Tensor]]:
        """Batches of the test set (idx None) or of training-pool indices (validation)."""
        xs, ys = (self.test_x, self.test_y) if split == "test" else (self.train_x, self.train_y)
        total = ys.numel() if idx is None else idx.numel()
        for start in range(0, total, batch_size):
            sel = slice(start, start + batch_size)
            if idx is None:
                yield self.prepare(xs[sel]), targets(self, split, sel)
            else:
                part = idx[sel]
                yield self.prepare(xs[part] if split == "test" else self.train_images(part)), targets(self, split, part)


# Functions of the data rather than DeviceData methods: the trainer and evaluation also run on
# stand-ins that hold only images (train_x, train_y, prepare), which these read as images.
def targets(data, split: str, idx: Tensor | slice) -> Tensor:
    """What the model's output at `idx` (any shape) of `split` is scored against: the labels, or for
    tokens the next character at every position ([..., T])."""
    xs, ys = (data.test_x, data.test_y) if split == "test" else (data.train_x, data.train_y)
    return xs[idx][..., 1:].long() if getattr(data, "inputs", "images") == "tokens" else ys[idx]


def local_test(data, idx: Tensor) -> tuple[Tensor, Tensor]:
    """Inputs and targets of clients' local test samples `idx` (DeviceData.local_tests says where they are)."""
    split = getattr(data, "local_tests", "train")
    return data.prepare(data.test_x[idx] if split == "test" else data.train_images(idx)), targets(data, split, idx)


def crop_geometry(data) -> tuple[int, int | None, int]:
    """(zero padding, output side or None for the input's own, offsets per axis) of `data`'s training crop."""
    crop = getattr(data, "crop", None)
    if crop is None:
        return CROP_PADDING, None, 2 * CROP_PADDING + 1
    return 0, crop, data.train_x.shape[-1] - crop + 1


def center_crop(x: Tensor, crop: int | None) -> Tensor:
    """The central crop x crop of [B, C, H, W] (offset (H - crop) // 2, as tf.image's central crop); x itself
    when crop is None or x is that size already."""
    if crop is None or x.shape[-1] == crop:
        return x
    top, left = (x.shape[-2] - crop) // 2, (x.shape[-1] - crop) // 2
    return x[..., top: top + crop, left: left + crop]


def random_crop_flip(x: Tensor, generator: torch.Generator | None, crop: int | None = None) -> Tensor:
    """Per-sample random crop (after zero padding of 4, or an unpadded crop x crop), then a random horizontal flip."""
    if crop is None:
        return apply_crop_flip(x, *draw_crop_flip(x.shape[0], generator, x.device))
    drawn = draw_crop_flip(x.shape[0], generator, x.device, span=x.shape[-1] - crop + 1)
    return apply_crop_flip(x, *drawn, padding=0, size=crop)


def draw_crop_flip(b: int, generator: torch.Generator | None, device: torch.device,
                   span: int = 2 * CROP_PADDING + 1) -> tuple[Tensor, Tensor, Tensor]:
    """The random part of `random_crop_flip` for a batch of `b`: offsets oy, ox [b, 1] in [0, span) and flip [b],
    in that order. A 24 crop of 32 has the same span (9) as the padded 32 crop, so it draws the same values.

    A parallel engine draws these per client ahead of training, from the same stream and in
    the same order as a client trained alone, and applies them later to stacked batches.
    """
    oy = torch.randint(0, span, (b, 1), device=device, generator=generator)
    ox = torch.randint(0, span, (b, 1), device=device, generator=generator)
    flip = torch.rand(b, device=device, generator=generator) < 0.5
    return oy, ox, flip


def apply_crop_flip(x: Tensor, oy: Tensor, ox: Tensor, flip: Tensor, padding: int = CROP_PADDING,
                    size: int | None = None) -> Tensor:
    """Crop [B, C, H, W] to size x size (default H x W) at offsets (oy, ox) [B, 1] of its copy zero-padded by
    `padding`, then flip where `flip` [B].

    Pure data movement with zero fill, so it commutes with the uint8 -> float conversion.
    """
    b, _, h, w = x.shape
    h, w = (h, w) if size is None else (size, size)
    dev = x.device
    padded = F.pad(x, (padding,) * 4) if padding else x
    rows = (oy + torch.arange(h, device=dev)).view(b, 1, h, 1)
    cols = (ox + torch.arange(w, device=dev)).view(b, 1, 1, w)
    batch = torch.arange(b, device=dev).view(b, 1, 1, 1)
    chan = torch.arange(x.shape[1], device=dev).view(1, -1, 1, 1)
    cropped = padded[batch, chan, rows, cols]
    return torch.where(flip.view(b, 1, 1, 1), cropped.flip(-1), cropped)
