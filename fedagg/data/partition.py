"""Client splits of a labelled training set, one function per `conf/partition/*.yaml`.

Every function is `NAME(labels, num_clients, *, generator, **params) -> list[Tensor]`:
one int64 index tensor per client, pairwise disjoint and non-empty. All randomness comes
from `generator`, so one seed fixes the split whatever aggregator runs on it (DESIGN
principle 5). Parameters are checked before anything is drawn, and a request that cannot
be met is a ValueError naming the parameter, its value and what would work.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from fedagg.config.constraints import typed


def _fail(name: str, value, allowed: str):
    raise ValueError(f"{name}={typed(value)} is not allowed: {allowed}")


def _check_int(name: str, value, lo: int, hi: int | None = None, why: str = "") -> int:
    # a float such as 2.5 from the command line must not be truncated silently
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        _fail(name, value, "it must be an integer")
    if value < lo or (hi is not None and value > hi):
        _fail(name, value, f"it must be {f'at least {lo}' if hi is None else f'between {lo} and {hi}'}{why}")
    return int(value)


def _check_real(name: str, value, lo: float, strict: bool, why: str = "") -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < lo or (strict and value == lo):
        _fail(name, value, f"it must be a finite number {'greater than' if strict else 'at least'} {lo}{why}")
    return float(value)


def _prepare(labels: Tensor, num_clients) -> tuple[Tensor, int]:
    if not isinstance(labels, Tensor) or labels.dim() != 1 or labels.is_floating_point() or labels.numel() == 0:
        shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"labels must be a non-empty 1-D integer tensor, got {shape}")
    # the generator lives on the CPU, and so do the index tensors handed back
    labels = labels.cpu().long()
    n = labels.numel()
    return labels, _check_int("num_clients", num_clients, 1, n, " (the number of samples, one each at least)")


def _numpy_rng(generator: torch.Generator) -> np.random.Generator:
    # torch's Dirichlet takes no generator; seeding numpy from the torch stream keeps one seed in charge
    return np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator)))


def _class_pools(labels: Tensor, present: Tensor, generator, available: Tensor | None = None) -> list[Tensor]:
    """Shuffled indices of each class in `present` (aligned with it), from `available` or all."""
    idx = torch.arange(labels.numel()) if available is None else available
    idx = idx[torch.randperm(idx.numel(), generator=generator)]
    pos = torch.searchsorted(present, labels[idx])
    # the stable sort keeps the shuffled order inside each class
    idx = idx[torch.sort(pos, stable=True).indices]
    return list(idx.split(torch.bincount(pos, minlength=len(present)).tolist()))


def _shares(sizes: Tensor, cpc: int) -> Tensor:
    # An even split whose remainder goes to a client's first classes. Each share is
    # non-decreasing in the size, so class demand is monotone and a bisection can find
    # the largest size that fits.
    return (sizes[:, None] + cpc - 1 - torch.arange(cpc)) // cpc


def _demand(choice: Tensor, sizes: Tensor, num_classes: int) -> Tensor:
    shares = _shares(sizes, choice.shape[1])
    return torch.zeros(num_classes, dtype=torch.long).index_add_(0, choice.flatten(), shares.flatten())


def _largest_fit(lo: int, hi: int, fits) -> int | None:
    """Largest x in [lo, hi] with fits(x) for a monotone fits; None when even lo fails."""
    if lo > hi or not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _balanced_classes(num_classes: int, num_clients: int, cpc: int, generator) -> Tensor:
    """Each client's classes: the least used so far, ties broken at random.

    Class loads then differ by at most one. Independent uniform choices would leave some
    class wanted by far more clients than its pool can feed (100 two-class clients of
    600 on MNIST), so a split that fits on average would fail by chance.
    """
    load = torch.zeros(num_classes)
    rows = []
    for _ in range(num_clients):
        row = (load + torch.rand(num_classes, generator=generator)).argsort()[:cpc]
        load[row] += 1
        rows.append(row)
    return torch.stack(rows)


def _capacity_classes(pool_sizes: Tensor, sizes: Tensor, cpc: int, generator) -> Tensor:
    """Largest clients first, each draws classes ∝ what is left of them, so a big client
    lands on classes that can still feed it (unequal sizes make plain load balance useless)."""
    left = pool_sizes.double().clone()
    rows = torch.empty(len(sizes), cpc, dtype=torch.long)
    for k in sizes.argsort(descending=True).tolist():
        rows[k] = torch.multinomial(left.clamp(min=1.0), cpc, replacement=False, generator=generator)
        left[rows[k]] -= _shares(sizes[k : k + 1], cpc)[0].double()
    return rows


def _check_supply(present: Tensor, available: Tensor, choice: Tensor, sizes: Tensor, what: str, hint: str):
    need = _demand(choice, sizes, len(present))
    short = (need > available).nonzero().flatten()
    if len(short):
        c = int(short[0])
        raise ValueError(f"{what} cannot be met: class {int(present[c])} would have to supply {int(need[c])} samples "
                         f"to the clients that drew it but has only {int(available[c])}; {hint}")


def _draw(pools: list[Tensor], choice: Tensor, sizes: Tensor) -> list[Tensor]:
    """Each client takes its shares from the front of its classes' shuffled pools, so clients never overlap."""
    shares = _shares(sizes, choice.shape[1]).tolist()
    start = [0] * len(pools)
    parts = []
    for row, row_shares in zip(choice.tolist(), shares):
        pieces = []
        for c, n in zip(row, row_shares):
            pieces.append(pools[c][start[c] : start[c] + n])
            start[c] += n
        parts.append(torch.cat(pieces))
    return parts


def iid(labels: Tensor, num_clients: int, *, generator: torch.Generator,
        samples_per_client: int | None = None) -> list[Tensor]:
    """Shuffled split; sizes differ by at most one, or exactly `samples_per_client` each."""
    labels, num_clients = _prepare(labels, num_clients)
    n = labels.numel()
    if samples_per_client is not None:
        samples_per_client = _check_int("partition.samples_per_client", samples_per_client, 1, n // num_clients,
                                        f" so that num_clients={num_clients} clients fit in {n} samples")
    perm = torch.randperm(n, generator=generator)
    if samples_per_client is None:
        return [p.clone() for p in perm.tensor_split(num_clients)]
    return [p.clone() for p in perm[: samples_per_client * num_clients].split(samples_per_client)]


def shards(labels: Tensor, num_clients: int, *, generator: torch.Generator, shards_per_client: int = 2) -> list[Tensor]:
    """McMahan's pathological non-IID: label-sorted data cut into near-equal shards, dealt out at random."""
    labels, num_clients = _prepare(labels, num_clients)
    n = labels.numel()
    spc = _check_int("partition.shards_per_client", shards_per_client, 1, n // num_clients,
                     f" so that num_clients={num_clients} × shards_per_client shards of one sample at least fit in {n}")
    perm = torch.randperm(n, generator=generator)
    # shuffling first makes which samples of a class share a shard random too
    order = perm[torch.sort(labels[perm], stable=True).indices]
    pieces = order.tensor_split(num_clients * spc)
    deal = torch.randperm(num_clients * spc, generator=generator).view(num_clients, spc)
    return [torch.cat([pieces[j] for j in row]) for row in deal.tolist()]


def n_class(labels: Tensor, num_clients: int, *, generator: torch.Generator, classes_per_client: int = 2,
            samples_per_client: int | None = None) -> list[Tensor]:
    """Each client: `samples_per_client` samples from exactly `classes_per_client` random classes.

    `samples_per_client: null` takes the largest equal size the class pools allow for the
    classes drawn. A client's size is split as evenly as possible over its classes.
    """
    labels, num_clients = _prepare(labels, num_clients)
    n = labels.numel()
    present, counts = torch.unique(labels, return_counts=True)
    cpc = _check_int("partition.classes_per_client", classes_per_client, 1, len(present), " (the number of classes present)")
    if samples_per_client is not None:
        samples_per_client = _check_int("partition.samples_per_client", samples_per_client, cpc, n // num_clients,
                                        f" (one sample per class at least; num_clients={num_clients} must fit in {n})")
    choice = _balanced_classes(len(present), num_clients, cpc, generator)
    if samples_per_client is None:
        size = _largest_fit(cpc, n // num_clients,
                            lambda s: bool((_demand(choice, torch.full((num_clients,), s), len(present)) <= counts).all()))
        if size is None:
            raise ValueError(f"partition.samples_per_client=None cannot be met: the class pools cannot give each of "
                             f"num_clients={num_clients} clients one sample from each of its "
                             f"partition.classes_per_client={cpc} classes; use fewer clients or a smaller "
                             f"partition.classes_per_client")
    else:
        size = samples_per_client
    sizes = torch.full((num_clients,), size)
    _check_supply(present, counts, choice, sizes, f"partition.samples_per_client={samples_per_client}",
                  "use a smaller partition.samples_per_client (or null for the largest that fits)")
    return _draw(_class_pools(labels, present, generator), choice, sizes)


def dirichlet(labels: Tensor, num_clients: int, *, generator: torch.Generator, alpha: float = 0.5,
              min_size: int = 10, max_retries: int = 100) -> list[Tensor]:
    """Per class, proportions over clients ~ Dir(alpha); redrawn until every client has `min_size`."""
    labels, num_clients = _prepare(labels, num_clients)
    n = labels.numel()
    alpha = _check_real("partition.alpha", alpha, 0.0, strict=True, why=" (smaller is more skewed)")
    min_size = _check_int("partition.min_size", min_size, 0, n // num_clients,
                          f" so that num_clients={num_clients} clients of min_size fit in {n} samples")
    max_retries = _check_int("partition.max_retries", max_retries, 1)
    need = max(min_size, 1)  # clients are never empty, whatever min_size says
    present = torch.unique(labels)
    pools = _class_pools(labels, present, generator)
    rng = _numpy_rng(generator)
    smallest = 0
    for _ in range(max_retries):
        props = rng.dirichlet(np.full(num_clients, alpha), size=len(pools))
        cuts = [np.round(np.cumsum(p)[:-1] * len(pool)).astype(np.int64) for p, pool in zip(props, pools)]
        sizes = sum(np.diff(c, prepend=0, append=len(pool)) for c, pool in zip(cuts, pools))
        if sizes.min() >= need:
            pieces = [pool.tensor_split(c.tolist()) for c, pool in zip(cuts, pools)]
            return [torch.cat([p[k] for p in pieces]) for k in range(num_clients)]
        smallest = max(smallest, int(sizes.min()))
    # `need`, not min_size: a client is never empty, so min_size=0 asks for one sample as 1 does
    wanted = (f"partition.min_size={min_size} samples" if min_size >= 1
              else "one sample, as no client may be empty (partition.min_size=0)")
    raise ValueError(f"dirichlet split failed: in partition.max_retries={max_retries} draws with partition.alpha="
                     f"{alpha} and num_clients={num_clients}, no draw gave every client {wanted} "
                     f"(the best smallest client had {smallest}); raise partition.alpha"
                     f"{', lower partition.min_size' if min_size > 1 else ''}, use fewer clients or raise "
                     f"partition.max_retries")


def power_law(labels: Tensor, num_clients: int, *, generator: torch.Generator, exponent: float = 1.5,
              min_size: int = 10, label_dist: str = "iid", classes_per_client: int = 2) -> list[Tensor]:
    """Unbalanced clients (FedNNNN): the r-th largest holds a share ∝ r^-exponent on top of `min_size`.

    A rank-size (Zipf) law gives the same shape for every seed, which matters with few
    clients: Pareto-drawn sizes for 3–10 clients often come out nearly balanced. The
    default 1.5 puts most data on a fifth of the clients (about 70% for 10, 90% for 100)
    while the smallest still train on `min_size`; 0 gives equal sizes. Sizes sum to at
    most N. `label_dist` says how a client's samples are drawn: `iid` from all data, or
    `n_class` from `classes_per_client` classes (scaled down until the class pools fit).
    """
    labels, num_clients = _prepare(labels, num_clients)
    n = labels.numel()
    exponent = _check_real("partition.exponent", exponent, 0.0, strict=False)
    if label_dist not in ("iid", "n_class"):
        _fail("partition.label_dist", label_dist, "it must be 'iid' or 'n_class'")
    present, counts = torch.unique(labels, return_counts=True)
    cpc = 1
    if label_dist == "n_class":
        cpc = _check_int("partition.classes_per_client", classes_per_client, 1, len(present), " (the number of classes present)")
    min_size = _check_int("partition.min_size", min_size, 0, n // num_clients,
                          f" so that num_clients={num_clients} clients of min_size fit in {n} samples")
    floor = max(min_size, cpc, 1)  # an n_class client needs a sample from each of its classes
    if floor * num_clients > n:
        _fail("partition.classes_per_client", cpc, f"num_clients={num_clients} clients with one sample per class exceed {n} samples")
    rank = torch.randperm(num_clients, generator=generator) + 1  # which client gets which size is random
    weight = rank.double() ** -exponent
    weight /= weight.sum()
    spare = n - floor * num_clients

    def sizes_for(budget: int) -> Tensor:
        # flooring leaves fewer than num_clients samples unused, and keeps sizes monotone in the budget
        return floor + (budget * weight).floor().long()

    if label_dist == "iid":
        sizes = sizes_for(spare)
        return [p.clone() for p in torch.randperm(n, generator=generator)[: int(sizes.sum())].split(sizes.tolist())]
    choice = _capacity_classes(counts, sizes_for(spare), cpc, generator)
    budget = _largest_fit(0, spare, lambda b: bool((_demand(choice, sizes_for(b), len(present)) <= counts).all()))
    if budget is None:
        raise ValueError(f"partition.min_size={min_size} cannot be met: with partition.classes_per_client={cpc} the "
                         f"class pools cannot give each of num_clients={num_clients} clients {floor} samples; lower "
                         f"partition.min_size, use fewer clients or raise partition.classes_per_client")
    return _draw(_class_pools(labels, present, generator), choice, sizes_for(budget))


CLASS_CHOICES = ("random", "balanced")


def _random_classes(num_classes: int, num_clients: int, cpc: int, generator) -> Tensor:
    """Each client's classes: `cpc` distinct ones uniformly at random, independently of the other
    clients, so two clients can share classes and a class can go unused (FedAdp's paper (Wu & Wang 2021), Sec. II-B)."""
    return torch.rand(num_clients, num_classes, generator=generator).argsort(dim=1)[:, :cpc]


def mixed(labels: Tensor, num_clients: int, *, generator: torch.Generator, num_iid: int = 5,
          classes_per_client: int = 1, samples_per_client: int = 600, class_choice: str = "random") -> list[Tensor]:
    """FedAdp's setup: the first `num_iid` clients IID, the rest `classes_per_client`-class,
    `samples_per_client` each (600 in FedAdp's paper (Wu & Wang 2021), on 10 nodes). `class_choice`: `random`
    (FedAdp's paper (Wu & Wang 2021): each class "is selected at random and can be overlapped") or `balanced`
    (class loads differ by at most one)."""
    if class_choice not in CLASS_CHOICES:
        raise ValueError(f"partition.class_choice={class_choice!r} is not allowed; choose one of {', '.join(CLASS_CHOICES)}")
    labels, num_clients = _prepare(labels, num_clients)
    n = labels.numel()
    num_iid = _check_int("partition.num_iid", num_iid, 0, num_clients, f" (num_clients={num_clients})")
    present = torch.unique(labels)
    cpc = _check_int("partition.classes_per_client", classes_per_client, 1, len(present), " (the number of classes present)")
    spc = _check_int("partition.samples_per_client", samples_per_client, cpc, n // num_clients,
                     f" (one sample per class at least; num_clients={num_clients} must fit in {n})")
    perm = torch.randperm(n, generator=generator)
    # IID clients draw from the whole training set, as in the paper; the others from what is left
    parts = [p.clone() for p in perm[: num_iid * spc].split(spc)] if num_iid else []
    rest = perm[num_iid * spc :]
    if num_iid == num_clients:
        return parts
    left = torch.bincount(torch.searchsorted(present, labels[rest]), minlength=len(present))
    pick = _random_classes if class_choice == "random" else _balanced_classes
    choice = pick(len(present), num_clients - num_iid, cpc, generator)
    sizes = torch.full((num_clients - num_iid,), spc)
    _check_supply(present, left, choice, sizes, f"partition.samples_per_client={spc}",
                  "use a smaller partition.samples_per_client or fewer IID clients (partition.num_iid)"
                  + (", or partition.class_choice=balanced" if class_choice == "random" else ""))
    return parts + _draw(_class_pools(labels, present, generator, rest), choice, sizes)
