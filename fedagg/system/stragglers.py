"""`system=stragglers` (SPEC "Heterogeneous clients", as in FedNova's experiments).

Each round ⌊fraction · K⌋ of the K training clients, drawn from the stream
(seed, "stragglers", round), stop after a number of local steps drawn uniformly from
1 to their full budget; they train on the first batches of their usual batch plan.
"""

from __future__ import annotations

import torch

from fedagg.config.constraints import checked
from fedagg.data.seeding import generator
from fedagg.system.base import Probability, System


class Stragglers(System):
    @checked("system.")
    def __init__(self, fraction: Probability = 0.5) -> None:
        self.fraction = float(fraction)

    def budgets(self, seed: int, round: int, ids: list[int], full: list[int]) -> list[int]:
        g = generator(seed, "stragglers", round)
        lagging = torch.randperm(len(ids), generator=g)[: int(self.fraction * len(ids))].tolist()
        draws = torch.rand(len(ids), generator=g).tolist()  # one per client, used by the lagging ones
        budgets = list(full)
        for k in lagging:
            budgets[k] = 1 + int(draws[k] * full[k])  # uniform in 1 .. full[k]
        return budgets

