"""`dataset=femnist_fedprox`: the FEMNIST FedProx trained on (Li et al. 2020, App. C.1, Table 1), not LEAF's writers.

FedProx re-partitioned FEMNIST to add label heterogeneity (litian96/FedProx@d2a4501
`data/nist/data/my_sample.py`, its README: "subsampled (and repartitioned)"): only the ten
lowercase letters a–j, relabelled 0..9; up to 4,000 shuffled images of each; 200 devices,
device u drawing n_u ~ lognormal(4, 1) + 5 and taking max(2, ⌊n_u / C⌋) images of each of
the C classes (u + j) mod 10, j = 0..C−1 (C = 3 in the code, 5 in the text), in turn from
each class's shuffled pool; each device's samples shuffled and cut 90/10 train/test. The
paper's Table 1 counts 18,345 samples (its own draw; this one comes from the stream
(`dataset.seed`, "femnist_fedprox"), the same for every run).

Built from LEAF's FEMNIST files (or TFF's copy, as `dataset=femnist` reads them): every
writer's images, train and test, pooled. Deviations, each on purpose:
- the authors read NIST's by_class `train_*` folders; LEAF's files hold the by_writer images,
  the same NIST SD19 pictures grouped by writer;
- their loop resets a class's read position to 0 whenever enough images remain
  (`if idx + n < len: idx = 0`, an inverted test), so nearly every device starts from the
  same first images and devices share pictures; here each device takes the next unused
  images, so devices are disjoint (fedagg's design: partitions are disjoint), and a class that runs out
  is an error rather than a silent reuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import numpy as np
import torch

from fedagg.config.constraints import Range, checked
from fedagg.data import leaf
from fedagg.data.datasets import DatasetBundle
from fedagg.data.files import DataError
from fedagg.seeding import stream_seed

FIRST_LETTER = 36  # LEAF's (and TFF's) label of 'a': 0-9 digits, 10-35 'A'-'Z', 36-61 'a'-'z'
LETTERS = 10  # a..j
PER_CLASS = 4000  # my_sample.py keeps the first 4,000 shuffled images of a class

Devices = Annotated[int, Range(ge=1, integer=True, words="it must be an integer >= 1 (FedProx: 200)")]
ClassesPerDevice = Annotated[int, Range(ge=1, le=LETTERS, integer=True,
                                        words="it must be an integer in 1..10 (FedProx's code: 3, its text: 5)")]
TrainFrac = Annotated[float, Range(gt=0, lt=1, words="it must be a fraction in (0, 1) (FedProx: 0.9)")]


def fedprox_devices(labels: np.ndarray, *, num_devices: int = 200, classes_per_device: int = 3,
                    seed: int = 0) -> list[np.ndarray]:
    """Each device's rows of `labels` (LEAF's 62-class labels), FedProx's way (the module's docstring)."""
    rng = np.random.default_rng(stream_seed(seed, "femnist_fedprox"))
    sizes = rng.lognormal(4.0, 1.0, num_devices) + 5
    pools = [rng.permutation(np.flatnonzero(labels == FIRST_LETTER + c))[:PER_CLASS] for c in range(LETTERS)]
    taken = [0] * LETTERS
    devices = []
    for u, n in enumerate(sizes.tolist()):
        each = max(2, int(n / classes_per_device))
        rows = []
        for j in range(classes_per_device):
            c = (u + j) % LETTERS
            if taken[c] + each > len(pools[c]):
                raise DataError(f"femnist_fedprox: letter {chr(ord('a') + c)!r} has {len(pools[c])} images in the "
                                f"files read; device {u} needs images {taken[c] + 1}..{taken[c] + each}: "
                                "use LEAF's full FEMNIST, or fewer dataset.num_devices")
            rows.append(pools[c][taken[c]:taken[c] + each])
            taken[c] += each
        devices.append(np.concatenate(rows))
    return devices


@checked("dataset.")
def femnist_fedprox(root: str, *, mean: Sequence[float], std: Sequence[float], num_devices: Devices = 200,
                    classes_per_device: ClassesPerDevice = 3, train_frac: TrainFrac = 0.9, seed: int = 0,
                    download: bool = False, default_model: str | None = None) -> DatasetBundle:
    """FedProx's 10-letter FEMNIST: 1x28x28, labels 0..9 (a..j), one natural client per device."""
    del default_model  # the backbone fedagg.run trains when no model is chosen
    full = leaf.femnist(root, mean=mean, std=std, download=download)
    x = torch.cat([full.train_x, full.test_x]).numpy()
    y = torch.cat([full.train_y, full.test_y]).numpy()
    per_device = [(x[rows], y[rows] - FIRST_LETTER)
                  for rows in fedprox_devices(y, num_devices=num_devices, classes_per_device=classes_per_device,
                                              seed=seed)]
    t = leaf._split(f"femnist_fedprox{seed}", per_device, train_frac, in_order=False)  # int(0.9 n) train, as theirs
    return DatasetBundle("femnist_fedprox", t["train_x"], t["train_y"], t["test_x"], t["test_y"], LETTERS, mean, std,
                         False, train_owner=t["train_owner"], test_owner=t["test_owner"])
