"""Assemble a federation from instantiated parts: split the data, build the model, check the setup.

Everything here is plain Python called by `fedagg.run` (the Hydra edge) or by tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from fedagg.clients.trainer import ClientData
from fedagg.data.seeding import generator, stream_seed

DEVICES = ("auto", "cpu", "cuda")
DEFAULT_VAL_FRAC = 0.1


@dataclass(frozen=True)
class Settings:
    """The top-level keys of `conf/config.yaml` that drive the round loop."""

    seed: int = 0
    rounds: int = 20
    num_clients: int = 10
    clients_per_round: int | None = None
    eval_every: int = 1
    target_acc: float | None = None
    stop_at_target: bool = False
    checkpoint_every: int = 10

    def __post_init__(self) -> None:
        def need(ok: bool, key: str, value, allowed: str) -> None:
            if not ok:
                raise ValueError(f"{key}={value!r} is not allowed; {allowed}")

        need(isinstance(self.seed, int), "seed", self.seed, "it must be an integer")
        need(isinstance(self.rounds, int) and self.rounds >= 1, "rounds", self.rounds, "it must be an integer >= 1")
        need(isinstance(self.num_clients, int) and self.num_clients >= 1, "num_clients", self.num_clients, "it must be an integer >= 1")
        if self.clients_per_round is not None:
            need(
                isinstance(self.clients_per_round, int) and 1 <= self.clients_per_round <= self.num_clients,
                "clients_per_round",
                self.clients_per_round,
                f"it must be an integer from 1 to num_clients={self.num_clients}, or null for all",
            )
        need(isinstance(self.eval_every, int) and self.eval_every >= 1, "eval_every", self.eval_every, "it must be an integer >= 1")
        need(isinstance(self.checkpoint_every, int) and self.checkpoint_every >= 0, "checkpoint_every",
             self.checkpoint_every, "it must be an integer >= 0 (0: only at the end)")
        if self.target_acc is not None:
            need(0 < self.target_acc <= 1, "target_acc", self.target_acc, "it must be a fraction in (0, 1], or null")
        need(isinstance(self.stop_at_target, bool), "stop_at_target", self.stop_at_target, "it must be true or false")
        need(not self.stop_at_target or self.target_acc is not None, "stop_at_target", self.stop_at_target,
             "it needs a target_acc to stop at (set target_acc=0.95, say, or stop_at_target=false)")

    @property
    def per_round(self) -> int:
        return self.clients_per_round or self.num_clients


def resolve_device(name: str) -> torch.device:
    if name not in DEVICES:
        raise ValueError(f"device={name!r} is not allowed; choose one of {', '.join(DEVICES)}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but torch sees no CUDA device; use device=auto or device=cpu")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def sample_clients(settings: Settings, round: int) -> list[int]:
    """Client ids taking part in `round`, ascending; all of them without partial participation."""
    if settings.per_round == settings.num_clients:
        return list(range(settings.num_clients))
    g = generator(settings.seed, "sampling", round)
    chosen = torch.randperm(settings.num_clients, generator=g)[: settings.per_round]
    return sorted(chosen.tolist())


def make_clients(parts: list[Tensor], val_frac: float, seed: int, device: torch.device) -> list[ClientData]:
    """Index tensors per client, with an optional held-out validation split it never trains on."""
    clients = []
    for cid, idx in enumerate(parts):
        n_val = int(round(val_frac * idx.numel())) if val_frac > 0 else 0
        if val_frac > 0:
            n_val = min(max(n_val, 1), idx.numel() - 1)
            if n_val < 1:
                raise ValueError(
                    f"client.val_frac={val_frac} needs at least 2 samples per client, but client {cid} has {idx.numel()}"
                )
        shuffled = idx[torch.randperm(idx.numel(), generator=generator(seed, "val_split", cid))]
        val, train = (shuffled[:n_val], shuffled[n_val:]) if n_val else (idx[:0], idx)
        clients.append(ClientData(id=cid, train_idx=train.to(device), val_idx=val.to(device)))
    return clients


def build_model(factory: Callable[..., nn.Module], bundle, seed: int, device: torch.device) -> nn.Module:
    """The initial global model, drawn from its own stream without touching the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed(seed, "init"))
        model = factory(num_classes=bundle.num_classes, in_channels=bundle.in_channels, image_size=bundle.image_size)
    return model.to(device)


def effective_val_frac(val_frac: float | None, aggregator) -> float:
    """`client.val_frac: null` holds out 10% only when the aggregator scores clients on their own data."""
    if val_frac is not None:
        return val_frac
    scores_locally = "val_acc" in aggregator.requires and getattr(aggregator, "val_source", "local") == "local"
    return DEFAULT_VAL_FRAC if scores_locally else 0.0


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
