"""`system=dropout` (SPEC "Heterogeneous clients"): each sampled client fails to report with probability p.

The draw comes from the stream (seed, "dropout", round), one per sampled client. A client
that drops out does not train; the round aggregates the rest, and a round where nobody
reports keeps the global model.
"""

from __future__ import annotations

import torch

from fedagg.data.seeding import generator
from fedagg.system.base import System, probability


class Dropout(System):
    def __init__(self, p: float = 0.2) -> None:
        self.p = probability("p", p, below_one=True)  # p = 1 would leave every round empty

    def reporting(self, seed: int, round: int, sampled: list[int]) -> list[int]:
        draws = torch.rand(len(sampled), generator=generator(seed, "dropout", round)).tolist()
        return [i for i, u in zip(sampled, draws) if u >= self.p]
