"""`sampler=power_of_choice` (Cho, Wang, Joshi, AISTATS 2022): the k highest-loss of d candidates train.

Each step, d candidates are drawn without replacement with chances ∝ n_k; each is scored by the current global
model's mean loss F_k(w) on its whole training split (`samples: b`: on b of its samples drawn at random, the
paper's cpow-d), and the k with the largest loss train. The first step draws k uniformly (the authors select
before any model has been scored): the uniform sampler's round 1 or, on the asynchronous server, its first dispatch
(the clients in flight at the start). Later dispatches score the model the dispatched clients will be sent. The authors average the chosen models with 1/k;
here the aggregator decides (their setting is aggregator.weighting=uniform).

Authors' supplementary code, mirrored in peng-ju/Power-of-Choice@8c857a2:
image_classification/deprecated/original_implementation/1776-supp/code/dnn/util_v4.py:305-311 (pow-d: the candidate
draw and the sort by loss), train_dnn.py:56-71 (the first round uniform) and train_dnn.py:198-232 (the losses, in
eval mode; cpow-d on min(b, n_k) random samples with b their batch size).
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from fedagg.config.constraints import Range, checked
from fedagg.seeding import generator
from fedagg.sampling.base import Draw, Sampler, proportional

Count = Annotated[int, Range(ge=1, integer=True, words="it must be an integer >= 1, or null")]


def highest(ids: Tensor, losses: Tensor, k: int) -> Tensor:
    """The k of `ids` with the largest `losses`; ties go to the earlier id in `ids` (the authors' stable sort of
    (loss, id) pairs by loss, descending)."""
    return ids[torch.argsort(losses.cpu(), descending=True, stable=True)[:k]]


class PowerOfChoice(Sampler):
    equal_chance = False
    needs_losses = True
    shown = "sampler=power_of_choice"

    @checked("sampler.")
    def __init__(self, d: Count | None = None, samples: Count | None = None) -> None:
        self.d = d  # candidates per step; null: 2k (the paper's default), at most the clients in the pool
        self.samples = samples  # null: the whole training split (pow-d); b: b random samples (cpow-d)

    def check(self, per_round: int, pool: int, count: str = "clients_per_round") -> None:
        super().check(per_round, pool, count)
        if self.d is None:
            return
        if self.d < per_round:
            null = "2 x clients_per_round" if count == "clients_per_round" else "2 x the clients sent at once"
            raise ValueError(f"sampler.d={self.d} is not allowed with {count}={per_round}: Power-of-Choice "
                             f"trains the {per_round} highest-loss of d candidates, so d must be at least "
                             f"{count} (null: {null})")
        if self.d > pool:
            raise ValueError(f"sampler.d={self.d} is not allowed: only {pool} clients can be sampled (num_clients "
                             f"less eval.held_out_clients), so d must be at most {pool}")

    def candidates(self, k: int, pool: Tensor, step: int, draw: Draw) -> Tensor:
        """The step's d candidates, in the order drawn (∝ n_k, without replacement)."""
        d = min(self.d or 2 * k, len(pool))  # fewer online than d: every one of them
        return proportional(pool, draw.sizes[pool], d, generator(draw.seed, draw.stream, step))

    def select(self, k: int, pool: Tensor, step: int, draw: Draw) -> Tensor:
        if step == draw.first:
            return super().select(k, pool, step, draw)
        candidates = self.candidates(k, pool, step, draw)
        losses = draw.losses(candidates, self.samples, generator(draw.seed, f"{draw.stream}_losses", step))
        return highest(candidates, losses, k)
