"""Geometric median by smoothed Weiszfeld (RFA, Pillutla, Kakade, Harchaoui 2022).

The new global model minimises Σ_k α_k ‖v − W_k‖ (α_k = D_k): each Weiszfeld step
re-weights the clients by α_k / max(ν, ‖v − W_k‖), so a far-away model counts little. It
starts at the weighted mean and stops after `max_iter` steps or when the objective changes
by less than `tol` of itself (the stopping rule of the RFA authors' code). Computed on the
updates Δ_k = W_k − w (the same median, shifted by w, with smaller numbers). Reported
weights are uniform (fedagg's choice).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedagg.aggregators.inputs import RoundInputs
from fedagg.aggregators.robust import Count, Positive, RobustRule, uniform
from fedagg.config.constraints import checked


def weiszfeld(points: Tensor, alpha: Tensor, nu: float, max_iter: int, tol: float) -> tuple[Tensor, int]:
    """(the smoothed geometric median of points [B, P] with weights alpha [B], steps taken)."""
    v = alpha @ points
    objective = float(alpha @ torch.linalg.vector_norm(points - v, dim=1))
    for step in range(1, max_iter + 1):
        beta = alpha / torch.linalg.vector_norm(points - v, dim=1).clamp_min(nu)
        v = (beta / beta.sum()) @ points
        previous, objective = objective, float(alpha @ torch.linalg.vector_norm(points - v, dim=1))
        if abs(previous - objective) <= tol * objective:
            return v, step
    return v, max_iter


class GeoMed(RobustRule):
    """`conf/aggregator/geomed.yaml`: w + geometric median of the updates."""

    @checked("aggregator.")
    def __init__(self, nu: Positive = 1e-6, max_iter: Count = 10, tol: Positive = 1e-5, bucket_size: Count = 1) -> None:
        super().__init__(bucket_size)
        self.nu, self.tol = float(nu), float(tol)
        self.max_iter = max_iter

    def combine(self, inputs: RoundInputs, models: Tensor, num_samples: Tensor) -> tuple[Tensor, Tensor]:
        alpha = num_samples / num_samples.sum()
        median, steps = weiszfeld(models - inputs.global_params, alpha, self.nu, self.max_iter, self.tol)
        return inputs.global_params + median, uniform(models.shape[0], models), {"weiszfeld_steps": steps}
