"""`sampler=uniform`: k of the pool drawn uniformly without replacement (the default, and the stream runs always had).

A sampler answers one question: which k of the ids in `pool` (the clients online, less the held-out ones) train at
step `step` — a round of the synchronous loop, or a dispatch of an asynchronous driver that sends one or a few idle
clients off at a time. Each draw comes from the stream (seed, `Draw.stream`, step): "sampling" and rounds numbered
from 1 in the synchronous loop, "dispatch" and dispatches numbered from 0 on the asynchronous server (whose uniform
draw is then the one it always made). So two runs that differ only in the aggregator choose the same clients (DESIGN
principle 6), the two servers' draws never share a stream, and a resumed run draws as if it had never stopped.
What a rule may read beyond the ids is in `Draw`: every client's training-sample count and, for a rule that
declares `needs_losses`, the current global model's loss on clients' training data, computed by the loop when asked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from torch import Tensor

from fedagg.seeding import generator

log = logging.getLogger("fedagg")

class Losses(Protocol):
    def __call__(self, ids: Tensor, samples: int | None = None,
                 generator: torch.Generator | None = None) -> Tensor:
        """[M] float64: the current global model's mean loss (eval mode, no training) on each client's training
        split, or on `samples` of its training samples drawn with `generator` (all of them when it has fewer)."""


@dataclass(frozen=True)
class Draw:
    """What a sampler may read when it chooses, besides the pool."""

    seed: int
    sizes: Tensor  # [N] long: every client's training samples n_k
    losses: Losses | None = None  # given to a sampler that declares `needs_losses`
    stream: str = "sampling"  # the draws' stream: (seed, stream, step); a sampler's extra draws add a suffix
    first: int = 1  # the first step's number (1: rounds; 0: the asynchronous server's dispatches)


class Sampler:
    """Uniform without replacement: each client of the pool trains with chance k / |pool|."""

    # every client of the pool is equally likely, and the draw is uniform without replacement: what the privacy
    # accountant's q = K / pool assumes (channel=dp refuses any other sampler)
    equal_chance: ClassVar[bool] = True
    needs_losses: ClassVar[bool] = False  # True: `Draw.losses` must be given (the loop scores the global model)
    # how the start's note names a rule the user chose (`sampler=size`); None: the default uniform draw, never noted
    shown: ClassVar[str | None] = None

    def check(self, per_round: int, pool: int, count: str = "clients_per_round") -> None:
        """Refuse, before training, what this rule cannot draw: up to `per_round` clients a step (the setting named
        `count`: clients_per_round, or server.concurrency on the asynchronous server) from `pool` that can be
        sampled at most (num_clients less the held-out ones). A subclass that refuses more calls this first: it
        notes, in one line, a chosen rule that has nobody to choose among (`choose` then sends the whole pool)."""
        if self.shown is not None and per_round >= pool:  # legal, but the rule never runs
            sent = "every round" if count == "clients_per_round" else "again as soon as it arrives"
            log.warning("%s does nothing here: %s covers all %d clients that can train, so each one is sent %s, as "
                        "under any sampler", self.shown, count, pool, sent)

    def choose(self, k: int, pool: Tensor, step: int, draw: Draw) -> list[int]:
        """The ids of `pool` [M] (ascending) that train at `step` (counted from `draw.first`), ascending: k of them,
        or all when k covers the pool."""
        if k >= len(pool):
            return pool.tolist()
        return sorted(self.select(k, pool, step, draw).tolist())

    def select(self, k: int, pool: Tensor, step: int, draw: Draw) -> Tensor:
        """k distinct ids of `pool`, k < |pool|, in any order: the rule itself."""
        return pool[torch.randperm(len(pool), generator=generator(draw.seed, draw.stream, step))[:k]]


def proportional(ids: Tensor, weights: Tensor, k: int, g: torch.Generator) -> Tensor:
    """k of `ids` drawn without replacement with chances ∝ `weights` (one after another, each in proportion to the
    weights left: numpy's choice(p=..., replace=False)), in the order drawn. Ids of weight 0 are never drawn, so
    fewer than k come back when fewer than k have any weight."""
    k = min(k, int((weights > 0).sum()))
    if k == 0:
        return ids[:0]
    return ids[torch.multinomial(weights.double(), k, replacement=False, generator=g)]
