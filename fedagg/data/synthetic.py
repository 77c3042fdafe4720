"""`dataset=synthetic`: Synthetic(α, β) (Shamir et al. 2014 as in FedProx, Li et al. 2020, Sec. 5.1).

Generated, never downloaded, from its own stream (`dataset.seed`, not the run's seed: every
run of a comparison sees the same devices). Device k draws u_k ~ N(0, α) and B_k ~ N(0, β);
its model W_k ∈ R^{10×60} and b_k ∈ R^{10} have entries ~ N(u_k, 1), its inputs' mean
v_k ∈ R^{60} entries ~ N(B_k, 1); x ~ N(v_k, Σ) with Σ diagonal, Σ_jj = j^{-1.2}, and
y = argmax(W_k x + b_k) (softmax is monotone, so its argmax is the logits'). With `iid`, one
W, b for all and x ~ N(0, Σ). As in FedProx's generator (its `generate_niid.py`, which LEAF
ships), α and β are the normals' standard deviations, device sizes are
floor(lognormal(4, 2)) + 50 (a heavy-tailed, power-law-like spread), and each device keeps
its own 90/10 train/test split of its shuffled samples.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from fedagg.data.datasets import DatasetBundle
from fedagg.config.constraints import typed
from fedagg.seeding import stream_seed

DIM, CLASSES = 60, 10
SAY_EVERY_S = 10.0  # 100,000 devices take a minute or more to draw and split: a line at most this often meanwhile
log = logging.getLogger("fedagg")


class _Progress:
    """Logs "<what> k of N devices" at most every `every` seconds (none for a run that is done sooner)."""

    def __init__(self, what: str, total: int, every: float) -> None:
        self.what, self.total, self.every = what, total, every
        self.started = self.last = time.perf_counter()

    def __call__(self, done: int) -> None:
        now = time.perf_counter()
        if now - self.last >= self.every:
            self.last = now
            log.info("dataset synthetic: %s %d of %d devices (%.0f s)", self.what, done, self.total, now - self.started)


@dataclass
class Devices:
    """What the generator drew, device by device (kept for the tests of its statistics)."""

    u: np.ndarray  # [K] mean of W_k's and b_k's entries
    B: np.ndarray  # [K] mean of v_k's entries
    W: np.ndarray  # [K, 10, 60]
    b: np.ndarray  # [K, 10]
    v: np.ndarray  # [K, 60] mean of the device's inputs
    x: list[np.ndarray]  # [n_k, 60] per device, in drawn order
    y: list[np.ndarray]  # [n_k]


def covariance_diagonal() -> np.ndarray:
    return np.arange(1, DIM + 1, dtype=np.float64) ** -1.2


def generate(num_devices: int, alpha: float, beta: float, iid: bool, seed: int, size_mean: float = 4.0,
             size_sigma: float = 2.0, min_size: int = 50) -> Devices:
    rng = np.random.default_rng(stream_seed(seed, "synthetic"))
    sizes = rng.lognormal(size_mean, size_sigma, num_devices).astype(np.int64) + min_size
    u = rng.normal(0.0, alpha, num_devices)
    B = rng.normal(0.0, beta, num_devices)
    v = np.zeros((num_devices, DIM)) if iid else rng.normal(B[:, None], 1.0, (num_devices, DIM))
    W = rng.normal(u[:, None, None], 1.0, (num_devices, CLASSES, DIM))
    b = rng.normal(u[:, None], 1.0, (num_devices, CLASSES))
    if iid:  # one model for every device
        W[:], b[:] = rng.normal(0.0, 1.0, (CLASSES, DIM)), rng.normal(0.0, 1.0, CLASSES)
    scale = np.sqrt(covariance_diagonal())
    xs, ys = [], []
    progress = _Progress("drew", num_devices, SAY_EVERY_S)
    for k, n in enumerate(sizes.tolist()):
        x = v[k] + scale * rng.standard_normal((n, DIM))
        xs.append(x)
        ys.append(np.argmax(x @ W[k].T + b[k], axis=1))
        progress(k + 1)
    return Devices(u, B, W, b, v, xs, ys)


def _check(key: str, ok: bool, value, allowed: str) -> None:
    if not ok:
        raise ValueError(f"dataset.{key}={typed(value)} is not allowed; {allowed}")


def synthetic(root: str | None = None, *, alpha: float = 1.0, beta: float = 1.0, iid: bool = False,
              num_devices: int = 30, train_frac: float = 0.9, seed: int = 0, size_mean: float = 4.0,
              size_sigma: float = 2.0, min_size: int = 50, download: bool = False,
              default_model: str | None = None) -> DatasetBundle:
    """Synthetic(α, β) as 60-feature vectors ([N, 60, 1, 1]: `mlr`'s and `mlp`'s input), 10 classes, with each
    device a natural client (`partition=natural`); `root` and `download` are unused."""
    del root, download, default_model  # default_model: the backbone fedagg.run trains when no model is chosen
    for key, value in (("alpha", alpha), ("beta", beta)):
        _check(key, isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0, value,
               "it must be a number >= 0 (a standard deviation)")
    _check("num_devices", isinstance(num_devices, int) and not isinstance(num_devices, bool) and num_devices >= 1,
           num_devices, "it must be an integer >= 1")
    _check("train_frac", isinstance(train_frac, (int, float)) and 0 < train_frac < 1, train_frac,
           "it must be a fraction in (0, 1)")
    for key, value in (("size_mean", size_mean), ("size_sigma", size_sigma)):
        _check(key, isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 20, value,
               "it must be a number in [0, 20] (of the log of a device's sample count)")
    _check("min_size", isinstance(min_size, int) and not isinstance(min_size, bool) and min_size >= 2, min_size,
           "it must be an integer >= 2 (each device keeps one sample for training and one for testing)")
    devices = generate(num_devices, float(alpha), float(beta), bool(iid), int(seed), float(size_mean),
                       float(size_sigma), int(min_size))
    rng = np.random.default_rng(stream_seed(seed, "synthetic_split"))
    parts = {"train": ([], [], []), "test": ([], [], [])}
    progress = _Progress("split", num_devices, SAY_EVERY_S)
    for k, (x, y) in enumerate(zip(devices.x, devices.y)):
        order = rng.permutation(len(y))
        cut = min(max(int(train_frac * len(y)), 1), len(y) - 1)  # at least one sample on each side
        for split, rows in (("train", order[:cut]), ("test", order[cut:])):
            xs, ys, owner = parts[split]
            xs.append(x[rows])
            ys.append(y[rows])
            owner.append(np.full(len(rows), k))
        progress(k + 1)
    t = {split: [torch.from_numpy(np.concatenate(a)) for a in arrays] for split, arrays in parts.items()}
    as_x = lambda a: a.float().view(-1, DIM, 1, 1).contiguous()  # noqa: E731
    return DatasetBundle("synthetic", as_x(t["train"][0]), t["train"][1].long(), as_x(t["test"][0]),
                         t["test"][1].long(), CLASSES, (0.0,) * DIM, (1.0,) * DIM, False, inputs="vectors",
                         train_owner=t["train"][2].long(), test_owner=t["test"][2].long())
