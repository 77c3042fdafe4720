"""`system=dropout`: each sampled client fails to report with probability p.

The draw comes from the stream (seed, "dropout", round), one per sampled client. A client
that drops out does not train; the round aggregates the rest, and a round where nobody
reports keeps the global model.
"""

from __future__ import annotations

import torch

from fedagg.config.constraints import checked
from fedagg.seeding import generator
from fedagg.system.base import BelowOne, System


class Dropout(System):
    @checked("system.")
    def __init__(self, p: BelowOne = 0.2) -> None:  # p = 1 would leave every round empty
        self.p = float(p)

    def reporting(self, seed: int, round: int, sampled: list[int]) -> list[int]:
        draws = torch.rand(len(sampled), generator=generator(seed, "dropout", round)).tolist()
        return [i for i, u in zip(sampled, draws) if u >= self.p]
