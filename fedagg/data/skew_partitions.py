"""NIID-Bench's quantity and feature skews and Pachinko's two-level label skew, registered as
`conf/partition/{quantity_skew,feature_skew,pachinko}.yaml` with the contract of
`fedagg.data.partition` (disjoint, non-empty index tensors; all randomness from `generator`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedagg.data.partition import _check_int, _check_real, _class_pools, _fail, _numpy_rng, _prepare, iid

# CIFAR-100's coarse label (20 superclasses) of each fine label 0..99, as the python release's
# 'coarse_labels' pair with its 'fine_labels' (the commonly used sparse2coarse table,
# github.com/ryanchankh/cifar100coarse); every coarse label has exactly 5 fine ones.
CIFAR100_COARSE = (
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11,
    6, 11, 5, 10, 7, 6, 13, 15, 3, 15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5,
    5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13,
    16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
)


def quantity_skew(labels: Tensor, num_clients: int, *, generator: torch.Generator, beta: float = 0.5,
                  min_size: int = 10, max_retries: int = 100) -> list[Tensor]:
    """NIID-Bench's quantity skew: shares q ~ Dir_N(beta) of the shuffled pool, labels IID within a client;
    q is redrawn until every client has `min_size` samples (NIID-Bench: 10)."""
    labels, num_clients = _prepare(labels, num_clients)
    n = labels.numel()
    beta = _check_real("partition.beta", beta, 0.0, strict=True, why=" (smaller is more skewed)")
    min_size = _check_int("partition.min_size", min_size, 0, n // num_clients,
                          f" so that num_clients={num_clients} clients of min_size fit in {n} samples")
    max_retries = _check_int("partition.max_retries", max_retries, 1)
    need = max(min_size, 1)
    perm = torch.randperm(n, generator=generator)
    rng = _numpy_rng(generator)
    smallest = 0
    for _ in range(max_retries):
        q = rng.dirichlet(np.full(num_clients, beta))
        cuts = np.round(np.cumsum(q)[:-1] * n).astype(np.int64)
        sizes = np.diff(cuts, prepend=0, append=n)
        if sizes.min() >= need:
            return [p.clone() for p in perm.tensor_split(cuts.tolist())]
        smallest = max(smallest, int(sizes.min()))
    raise ValueError(f"quantity_skew split failed: in partition.max_retries={max_retries} draws with partition.beta="
                     f"{beta} and num_clients={num_clients}, no draw gave every client {need} samples (the best "
                     f"smallest client had {smallest}); raise partition.beta, lower partition.min_size, use fewer "
                     f"clients or raise partition.max_retries")


def feature_skew(labels: Tensor, num_clients: int, *, generator: torch.Generator,
                 samples_per_client: int | None = None, noise: float = 0.1) -> list[Tensor]:
    """NIID-Bench's noise-based feature skew: an `iid` split; client i of N sees its images with Gaussian noise
    of standard deviation noise * i / N in the normalised input space. The split is made here; the noise is
    `partition.noise`, which the run reads (any partition takes it) and adds on the device
    (fedagg.data.device.DeviceData.add_feature_noise)."""
    del noise
    return iid(labels, num_clients, generator=generator, samples_per_client=samples_per_client)


def _pick(p: np.ndarray, alive: np.ndarray, u: float) -> int:
    """Index drawn from `p` restricted to `alive` (renormalised) with the uniform `u`; a restriction whose
    mass underflowed to 0 (Dir(0.1) gives exact zeros) falls back to uniform over what is alive."""
    w = np.where(alive, p, 0.0)
    if w.sum() <= 0:
        w = alive.astype(np.float64)
    c = np.cumsum(w)
    return int(min(np.searchsorted(c, u * c[-1], side="right"), len(c) - 1))


def pachinko(labels: Tensor, num_clients: int, *, generator: torch.Generator, samples_per_client: int = 100,
             alpha: float = 0.1, beta: float = 10.0, coarse_of: list[int] | None = None) -> list[Tensor]:
    """Pachinko allocation (Li & McCallum 2006) as Reddi et al. 2021 (App. C) split CIFAR-100 over 500 clients.

    `labels` are fine labels; `coarse_of[f]` is fine label f's coarse label (null: CIFAR-100's). Client by
    client, in order: its coarse distribution ~ Dir(alpha) over the coarse labels, then for each coarse label
    (in increasing order) a distribution ~ Dir(beta) over its fine labels (in increasing order); then
    `samples_per_client` times: a coarse label from the first, a fine label of it from the second (each a
    uniform u against the cumulative mass of the labels that still have samples, renormalised), and the next
    sample of that fine label's shuffled pool, so samples are drawn without replacement. A fine label that
    runs out is removed from every later draw, and a coarse label once all its fine labels have.
    """
    labels, num_clients = _prepare(labels, num_clients)
    n = labels.numel()
    alpha = _check_real("partition.alpha", alpha, 0.0, strict=True)
    beta = _check_real("partition.beta", beta, 0.0, strict=True)
    spc = _check_int("partition.samples_per_client", samples_per_client, 1, n // num_clients,
                     f" so that num_clients={num_clients} clients fit in {n} samples")
    top = int(labels.max())
    if coarse_of is None and top + 1 < len(CIFAR100_COARSE):  # CIFAR-100's table would group unrelated labels
        example = [c * 2 // (top + 1) for c in range(top + 1)] if top < 20 else "[...]"
        _fail("partition.coarse_of", None, f"null means CIFAR-100's table of 100 fine labels to 20 coarse ones, but "
              f"these labels run 0..{top}; give each label's coarse label, e.g. partition.coarse_of="
              f"{str(example).replace(' ', '')}")
    coarse_of = np.asarray(CIFAR100_COARSE if coarse_of is None else list(coarse_of), dtype=np.int64)
    if int(labels.max()) >= len(coarse_of) or int(labels.min()) < 0:
        _fail("partition.coarse_of", "null (CIFAR-100's)" if len(coarse_of) == 100 else list(coarse_of),
              f"it maps {len(coarse_of)} fine labels, but the labels run to {int(labels.max())}: pachinko needs a "
              f"coarse label for each fine one (dataset=cifar100 or cifar100_fl)")
    fine_ids = np.arange(len(coarse_of))
    coarse_ids = np.unique(coarse_of)
    fines = [fine_ids[coarse_of == c] for c in coarse_ids]  # fine labels of each coarse label, increasing
    pools = _class_pools(labels, torch.arange(len(coarse_of)), generator)
    left = np.array([p.numel() for p in pools], dtype=np.int64)
    taken = np.zeros(len(coarse_of), dtype=np.int64)
    coarse_left = np.array([left[f].sum() for f in fines])
    rng = _numpy_rng(generator)
    parts = []
    for _ in range(num_clients):
        p_coarse = rng.dirichlet(np.full(len(coarse_ids), alpha))
        p_fine = [rng.dirichlet(np.full(len(f), beta)) for f in fines]
        picked = []
        for _ in range(spc):
            c = _pick(p_coarse, coarse_left > 0, rng.random())
            k = _pick(p_fine[c], left[fines[c]] > 0, rng.random())
            f = int(fines[c][k])
            picked.append(pools[f][taken[f]])
            taken[f] += 1
            left[f] -= 1
            coarse_left[c] -= 1
        parts.append(torch.stack(picked))
    return parts
