"""The pool a round samples from (the clients online, less those held out for evaluation), the chance of each
being sampled (the privacy accountant's q), and the default draw from it."""

from __future__ import annotations

import torch
from torch import Tensor

from fedagg.config.settings import Settings
from fedagg.sampling.base import Draw, Sampler


def sampling_pool(settings: Settings, online: Tensor | None = None) -> Tensor:
    """The ids a round samples from: the clients `online` [N] marks (everyone when None), less the held-out ones."""
    pool = torch.arange(settings.num_clients) if online is None else online.nonzero().view(-1)
    if settings.held_out:  # held-out clients are only ever scored (eval.held_out_clients)
        keep = torch.ones(settings.num_clients, dtype=torch.bool)
        keep[settings.held_out_ids] = False
        pool = pool[keep[pool]]
    return pool


def sampling_rate(settings: Settings, online: Tensor | None = None, count: int | None = None) -> float:
    """The chance that a client of the round's pool is sampled: K (or `count`, an over-selecting clock's) over the
    pool, 1 when that covers it (the privacy accountant's q; held-out and offline clients are never sampled)."""
    pool = len(sampling_pool(settings, online))
    return min(1.0, (count or settings.per_round) / pool) if pool else 0.0


def sample_clients(settings: Settings, round: int, online: Tensor | None = None, count: int | None = None) -> list[int]:
    """Client ids taking part in `round` under the default sampler (uniform), ascending: `clients_per_round` (or
    `count`, an over-selecting clock's ⌈(1 + o)K⌉) of the clients `online` [N] marks (everyone when None), or all
    of them when no more are online."""
    return Sampler().choose(count or settings.per_round, sampling_pool(settings, online), round,
                            Draw(settings.seed, torch.zeros(settings.num_clients, dtype=torch.long)))
