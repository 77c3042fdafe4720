"""`system=availability`: client k is online each round with probability q_k.

q_k ~ Beta(a, b) is drawn once per client from the stream (seed, "availability"); each
round client k is online with probability q_k, from the stream (seed, "online", round),
and sampling draws only among the clients online (all of them when fewer than
`clients_per_round` are). Beta(2, 2) is a choice (no source names values): availability 0.5
on average, most clients between 0.2 and 0.8.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
import torch
from torch import Tensor

from fedagg.seeding import generator, stream_seed
from fedagg.config.constraints import Range, checked
from fedagg.system.base import System

BetaParameter = Annotated[float, Range(gt=0, lt=float("inf"), words="it must be a finite number > 0 (a Beta parameter)")]


class Availability(System):
    takes_clients_offline = True

    @checked("system.")
    def __init__(self, a: BetaParameter = 2.0, b: BetaParameter = 2.0) -> None:
        self.a, self.b = float(a), float(b)

    def rates(self, seed: int, num_clients: int) -> Tensor:
        """q_k for every client: the same in every round and for every aggregator of this seed."""
        rng = np.random.default_rng(stream_seed(seed, "availability"))
        return torch.from_numpy(rng.beta(self.a, self.b, num_clients)).float()

    def online(self, seed: int, round: int, num_clients: int) -> Tensor:
        return torch.rand(num_clients, generator=generator(seed, "online", round)) < self.rates(seed, num_clients)
