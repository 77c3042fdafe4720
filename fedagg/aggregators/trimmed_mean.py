"""Coordinate-wise trimmed mean (Yin et al. 2018; SPEC "Robust aggregation").

Per coordinate, the b = ⌊β K⌋ largest and the b smallest values are dropped and the rest
averaged. β < 1/2 always keeps at least one value. A client's reported weight is the share
of the kept values that are its own.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedagg.aggregators.robust import CoordinateWise


class TrimmedMean(CoordinateWise):
    """`conf/aggregator/trimmed_mean.yaml`."""

    def __init__(self, beta: float = 0.1, bucket_size: int = 1) -> None:
        super().__init__(bucket_size)
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta < 0.5:
            raise ValueError(f"aggregator.beta={beta!r} is not allowed; it must be in [0, 0.5): with 0.5 or more "
                             "the trimmed mean trims every value away")
        self.beta = float(beta)

    def combine_columns(self, models: Tensor) -> tuple[Tensor, Tensor]:
        k = models.shape[0]
        b = int(self.beta * k)
        values, order = models.sort(dim=0)
        return values[b:k - b].mean(dim=0), torch.bincount(order[b:k - b].reshape(-1), minlength=k)

    def kept_per_coordinate(self, k: int) -> int:
        return k - 2 * int(self.beta * k)
