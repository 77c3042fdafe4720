"""Coordinate-wise median (Yin et al. 2018).

Each coordinate of the new global model is the median of the clients' values there (the
mean of the two middle values for an even count). A client's reported weight is the share
of coordinates its value was (one of) the median: for even counts each middle value
counts one half.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedagg.aggregators.robust import CoordinateWise


class Median(CoordinateWise):
    """`conf/aggregator/median.yaml`."""

    def combine_columns(self, models: Tensor) -> tuple[Tensor, Tensor]:
        b = models.shape[0]
        values, order = models.sort(dim=0)  # stable: tied values keep the round's order
        mid = b // 2
        if b % 2:
            return values[mid], torch.bincount(order[mid], minlength=b)
        kept = torch.bincount(order[mid - 1], minlength=b) + torch.bincount(order[mid], minlength=b)
        return (values[mid - 1] + values[mid]) / 2, kept

    def kept_per_coordinate(self, b: int) -> int:
        return 1 if b % 2 else 2  # for even counts each middle value counts one half
