"""Coordinate-wise trimmed mean (Yin et al. 2018).

Per coordinate, the b = ⌊β K⌋ largest and the b smallest values are dropped and the rest
averaged. β < 1/2 always keeps at least one value. A client's reported weight is the share
of the kept values that are its own.
"""

from __future__ import annotations

import logging
from typing import Annotated

import torch
from torch import Tensor

from fedagg.aggregators.inputs import ClientSetup
from fedagg.aggregators.robust import CoordinateWise, Count
from fedagg.config.constraints import Range, checked

# with 0.5 or more every value is trimmed away
Beta = Annotated[float, Range(ge=0, lt=0.5, words="it must be in [0, 0.5): with 0.5 or more the trimmed mean trims "
                                                  "every value away")]
log = logging.getLogger("fedagg")


class TrimmedMean(CoordinateWise):
    """`conf/aggregator/trimmed_mean.yaml`."""

    @checked("aggregator.")
    def __init__(self, beta: Beta = 0.1, bucket_size: Count = 1) -> None:
        super().__init__(bucket_size)
        self.beta = float(beta)

    def check_clients(self, setup: ClientSetup) -> None:
        super().check_clients(setup)
        k = self.models_per_round(setup)
        if self.beta > 0 and int(self.beta * k) == 0:  # legal, but not what a beta > 0 asks for
            log.warning("aggregator.beta=%g trims nothing from %d models a round (floor(beta * %d) = 0): the trimmed "
                        "mean is the plain mean; a beta of at least %.3g trims one value each side", self.beta, k, k,
                        1 / k)

    def combine_columns(self, models: Tensor) -> tuple[Tensor, Tensor]:
        k = models.shape[0]
        b = int(self.beta * k)
        values, order = models.sort(dim=0)
        return values[b:k - b].mean(dim=0), torch.bincount(order[b:k - b].reshape(-1), minlength=k)

    def kept_per_coordinate(self, k: int) -> int:
        return k - 2 * int(self.beta * k)
