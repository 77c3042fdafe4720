"""How the data becomes clients: the server's hold-out, each client's validation split, and
`experiment_scale`'s shrinking; and the initial model. Each draws from its own seeded stream."""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor, nn

from fedagg.clients.client import ClientData
from fedagg.seeding import generator, global_rng, stream_seed
from fedagg.models.base import Backbone


def make_clients(parts: list[Tensor], val_frac: float, seed: int, device: torch.device,
                 test_frac: float = 0.0) -> list[ClientData]:
    """Index tensors per client, with an optional held-out validation split and an optional local test split
    (each a share of the client's data, drawn from its own stream), neither of which it trains on."""
    clients = []
    for cid, idx in enumerate(parts):
        n_val = int(round(val_frac * idx.numel())) if val_frac > 0 else 0
        if val_frac > 0:
            n_val = min(max(n_val, 1), idx.numel() - 1)
            if n_val < 1:
                raise ValueError(
                    f"client.val_frac={val_frac} needs at least 2 samples per client, but client {cid} has {idx.numel()}"
                )
        val, train = idx[:0], idx
        if n_val:  # without a validation split nothing is shuffled (a stream per client: 1 s at 100,000 clients)
            shuffled = idx[torch.randperm(idx.numel(), generator=generator(seed, "val_split", cid))]
            val, train = shuffled[:n_val], shuffled[n_val:]
        test = idx[:0]
        if test_frac > 0:
            n_test = min(max(int(round(test_frac * idx.numel())), 1), train.numel() - 1)
            if n_test < 1:
                raise ValueError(f"client.test_frac={test_frac} leaves client {cid} ({idx.numel()} samples) "
                                 "nothing to train on; use a smaller client.test_frac or fewer clients")
            picked = torch.randperm(train.numel(), generator=generator(seed, "test_split", cid))
            test, train = train[picked[:n_test]], train[picked[n_test:].sort().values]
        clients.append(ClientData(id=cid, train_idx=train.to(device), val_idx=val.to(device), test_idx=test.to(device)))
    return clients


def build_model(factory: Callable[..., nn.Module], bundle, seed: int, device: torch.device,
                projection_head: int = 0) -> nn.Module:
    """The initial global model, drawn from its own stream without touching the global RNG; with
    `projection_head` > 0, MOON's projection head of that width under its classifier, drawn after the backbone
    (whose weights are then those of the same run without it)."""
    with global_rng(stream_seed(seed, "init")):  # the CPU generator only: built on the CPU, then moved
        model = factory(num_classes=bundle.num_classes, in_channels=bundle.in_channels, image_size=bundle.image_size)
        if projection_head and isinstance(model, Backbone):  # another model: refused by assembly.check_model_for
            model.add_projection_head(projection_head)
    return model.to(device)


def hold_out_server_split(num_train: int, server_samples: int, seed: int) -> tuple[Tensor, Tensor]:
    """(server indices, the pool the clients share); the server's samples are removed from every client."""
    if not 0 <= server_samples < num_train:
        raise ValueError(
            f"the aggregator holds out {server_samples} training samples for the server, but the training set "
            f"has {num_train}; use a smaller aggregator.server_val_size"
        )
    if server_samples == 0:
        return torch.arange(0), torch.arange(num_train)
    order = torch.randperm(num_train, generator=generator(seed, "server_split"))
    return order[:server_samples].sort().values, order[server_samples:].sort().values


def shrink(parts: list[Tensor], test_size: int, scale: float, seed: int) -> tuple[list[Tensor], Tensor | None]:
    """`experiment_scale` < 1 for a quick check: each client keeps that share of its samples
    (at least one) and the test set shrinks alike, so any partition stays feasible."""
    if scale >= 1:
        return parts, None
    g = generator(seed, "scale")
    kept = [p[torch.randperm(p.numel(), generator=g)[: max(1, math.ceil(scale * p.numel()))]].sort().values for p in parts]
    test = torch.randperm(test_size, generator=g)[: max(1, math.ceil(scale * test_size))].sort().values
    return kept, test


def scaled_rounds(rounds: int, scale: float) -> int:
    return max(1, math.ceil(rounds * min(scale, 1.0)))
