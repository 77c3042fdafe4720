"""`sampler=size`: k clients drawn without replacement with chances ∝ n_k, their training-sample counts.

A client with twice the data is about twice as likely to train (exactly twice for the first pick; the later picks
are in proportion to the sizes left). It is the candidate draw of Power-of-Choice (Cho, Wang, Joshi 2022), which
with d = k is this sampler.
"""

from __future__ import annotations

from torch import Tensor

from fedagg.seeding import generator
from fedagg.sampling.base import Draw, Sampler, proportional


class SizeProportional(Sampler):
    equal_chance = False
    shown = "sampler=size"

    def select(self, k: int, pool: Tensor, step: int, draw: Draw) -> Tensor:
        return proportional(pool, draw.sizes[pool], k, generator(draw.seed, draw.stream, step))
