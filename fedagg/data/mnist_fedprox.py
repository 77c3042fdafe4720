"""`dataset=mnist_fedprox`: the MNIST devices FedProx trained on (Li et al. 2020, Sec. 5.1, Table 1: 1,000
devices, 2 digits each, 69,035 samples), built the way the authors' generator builds them
(litian96/FedProx@d2a4501 `data/mnist/generate_niid.py:20-80`):

- all 70,000 images (training files first, then the test files, each digit's images in file order) as
  784-pixel vectors, standardised per pixel over all of them: (x − mean) / (std + 0.001) on the 0–255
  scale, the standard deviation the population one (numpy's default) (:20-22);
- device u holds the digits (u + j) mod 10, j = 0, 1, and first takes the next 5 images of each (:32-40);
- the rest of each digit is shared out by lognormal(0, 2) weights: one weight per (digit, u // 10, j),
  normalised over each digit's 2 · num_devices / 10 weights and scaled to the images it has left; device
  u takes int(share) more images of each of its digits, when that many remain (:44-56);
- each device's images are shuffled, the first int(0.9 n) are its training samples, the rest its own
  test samples (:65-80).

The authors draw the weights and shuffles with numpy's and Python's global generators; here they come
from fedagg's stream (`dataset.seed`, "mnist_fedprox"), so the devices' sizes differ from the authors'
JSON files (same structure, another draw; the same for every run). Every device is a natural client
(`partition=natural`).
"""

from __future__ import annotations

from typing import Annotated

import torch

from fedagg.config.constraints import Range, checked
from fedagg.data.datasets import DatasetBundle, mnist
from fedagg.data.files import DataError
from fedagg.seeding import generator

DIGITS = 10
PIXELS = 28 * 28
SIGMA_EPS = 0.001  # generate_niid.py:22, beside the per-pixel standard deviation

Devices = Annotated[int, Range(ge=10, integer=True, words="it must be a multiple of 10, at least 10 (FedProx: 1,000)")]
TrainFrac = Annotated[float, Range(gt=0, lt=1, words="it must be a fraction in (0, 1) (FedProx: 0.9)")]
Positive = Annotated[float, Range(ge=0, finite=True, words="it must be a number >= 0 (FedProx: 2.0)")]
First = Annotated[int, Range(ge=1, integer=True, words="it must be an integer >= 1 (FedProx: 5)")]


def standardised(x: torch.Tensor) -> torch.Tensor:
    """[N, 784] float32 pixels (0..255) -> (x − mean) / (std + 0.001) per pixel, over all N images."""
    x = x.to(torch.float32)
    return (x - x.mean(0)) / (x.std(0, correction=0) + SIGMA_EPS)


def fedprox_devices(labels: torch.Tensor, *, num_devices: int = 1000, first: int = 5, sigma: float = 2.0,
                    g: torch.Generator) -> list[torch.Tensor]:
    """Each device's rows of `labels`, in the order it takes them: `first` of each of its two digits, then its
    lognormal shares (the module's docstring)."""
    pools = [torch.nonzero(labels == d).flatten() for d in range(DIGITS)]
    taken = [0] * DIGITS
    rows: list[list[torch.Tensor]] = [[] for _ in range(num_devices)]
    for u in range(num_devices):
        for j in range(2):
            d = (u + j) % DIGITS
            if taken[d] + first > len(pools[d]):
                raise DataError(f"mnist_fedprox: digit {d} has {len(pools[d])} images; device {u} needs images "
                                f"{taken[d] + 1}..{taken[d] + first}: use fewer dataset.num_devices")
            rows[u].append(pools[d][taken[d]:taken[d] + first])
            taken[d] += first
    weights = (torch.randn(DIGITS, num_devices // 10, 2, generator=g, dtype=torch.float64) * sigma).exp()
    left = torch.tensor([len(p) - t for p, t in zip(pools, taken)], dtype=torch.float64).view(DIGITS, 1, 1)
    shares = left * weights / weights.sum((1, 2), keepdim=True)
    for u in range(num_devices):
        for j in range(2):
            d = (u + j) % DIGITS
            n = int(shares[d, u // 10, j])  # truncated, as int() in the authors' loop
            if taken[d] + n < len(pools[d]):  # their test: strictly fewer than the pool holds
                rows[u].append(pools[d][taken[d]:taken[d] + n])
                taken[d] += n
    return [torch.cat(r) for r in rows]


@checked("dataset.")
def mnist_fedprox(root: str, *, num_devices: Devices = 1000, first: First = 5, sigma: Positive = 2.0,
                  train_frac: TrainFrac = 0.9, seed: int = 0, download: bool = False,
                  default_model: str | None = None) -> DatasetBundle:
    """FedProx's MNIST devices as 784-feature vectors ([N, 784, 1, 1]: `mlr`'s input), 10 classes."""
    del default_model  # the backbone fedagg.run trains when no model is chosen
    if num_devices % 10:
        raise ValueError(f"dataset.num_devices={num_devices} is not allowed; it must be a multiple of 10 (each "
                         "lognormal weight serves devices u // 10; FedProx: 1,000)")
    raw = mnist(root, mean=(0.0,), std=(1.0,), download=download)
    x = standardised(torch.cat([raw.train_x, raw.test_x]).view(-1, PIXELS))
    y = torch.cat([raw.train_y, raw.test_y])
    g = generator(seed, "mnist_fedprox")
    parts = {"train": ([], []), "test": ([], [])}
    for rows in fedprox_devices(y, num_devices=num_devices, first=first, sigma=sigma, g=g):
        rows = rows[torch.randperm(len(rows), generator=g)]  # random.shuffle(combined)
        cut = int(train_frac * len(rows))  # train_len = int(0.9 * num_samples)
        for split, part in (("train", rows[:cut]), ("test", rows[cut:])):
            parts[split][0].append(part)
            parts[split][1].append(len(part))
    out = {}
    for split, (chunks, sizes) in parts.items():
        idx = torch.cat(chunks)
        out[split] = (x[idx].view(-1, PIXELS, 1, 1).contiguous(), y[idx].clone(),
                      torch.repeat_interleave(torch.arange(num_devices), torch.tensor(sizes)))
    (train_x, train_y, train_owner), (test_x, test_y, test_owner) = out["train"], out["test"]
    return DatasetBundle("mnist_fedprox", train_x, train_y, test_x, test_y, DIGITS, (0.0,) * PIXELS, (1.0,) * PIXELS,
                         False, inputs="vectors", train_owner=train_owner, test_owner=test_owner)
