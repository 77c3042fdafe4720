"""Coordinate-wise median (Yin et al. 2018; SPEC "Robust aggregation").

Each coordinate of the new global model is the median of the clients' values there (the
mean of the two middle values for an even count). A client's reported weight is the share
of coordinates its value was (one of) the median: for even counts each middle value
counts one half.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedagg.aggregators.inputs import RoundInputs
from fedagg.aggregators.robust import RobustRule


class Median(RobustRule):
    """`conf/aggregator/median.yaml`."""

    def combine(self, inputs: RoundInputs, models: Tensor, num_samples: Tensor) -> tuple[Tensor, Tensor]:
        b, p = models.shape
        values, order = models.sort(dim=0)  # stable: tied values keep the round's order
        mid = b // 2
        if b % 2:
            kept = torch.bincount(order[mid], minlength=b).to(models.dtype)
            return values[mid], kept / p
        kept = torch.bincount(order[mid - 1], minlength=b) + torch.bincount(order[mid], minlength=b)
        return (values[mid - 1] + values[mid]) / 2, kept.to(models.dtype) / (2 * p)
