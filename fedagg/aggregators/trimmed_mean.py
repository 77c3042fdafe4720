"""Coordinate-wise trimmed mean (Yin et al. 2018; SPEC "Robust aggregation").

Per coordinate, the b = ⌊β K⌋ largest and the b smallest values are dropped and the rest
averaged. β < 1/2 always keeps at least one value. A client's reported weight is the share
of the kept values that are its own.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedagg.aggregators.inputs import RoundInputs
from fedagg.aggregators.robust import RobustRule


class TrimmedMean(RobustRule):
    """`conf/aggregator/trimmed_mean.yaml`."""

    def __init__(self, beta: float = 0.1, bucket_size: int = 1) -> None:
        super().__init__(bucket_size)
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta < 0.5:
            raise ValueError(f"aggregator.beta={beta!r} is not allowed; it must be in [0, 0.5): with 0.5 or more "
                             "the trimmed mean trims every value away")
        self.beta = float(beta)

    def combine(self, inputs: RoundInputs, models: Tensor, num_samples: Tensor) -> tuple[Tensor, Tensor]:
        k, p = models.shape
        b = int(self.beta * k)
        values, order = models.sort(dim=0)
        kept = torch.bincount(order[b:k - b].reshape(-1), minlength=k).to(models.dtype)
        return values[b:k - b].mean(dim=0), kept / (p * (k - 2 * b))
