"""Each parameter's sensitivity, measured by the clients during local training (Elastic aggregation).

An aggregator that weighs parameters by how sensitive the model's output is to them declares
`Needs(sensitivity=Sensitivity(...))`; local training then keeps, per client id and across
rounds, Ω_k ← μ Ω_k + (1 − μ) s at every local step, s from the gradient of a per-client
target at the step's weights on its batch (in both engines, from the same definitions below),
and the round hands the participants' Ω_k [K, ·] to the aggregator (`RoundInputs.sensitivity`).

- `of: output` (Chen et al. 2023): the target is the batch mean of ‖f(x)‖², the squared norm of
  the logits, which needs no labels; `of: loss` (FL-bench): the task loss.
- `per: parameter` (the paper): s = |∂target/∂θ| for every parameter, Ω_k is [P];
  `per: tensor` (FL-bench): s = ‖∂target/∂θ_i‖² for every parameter tensor i, Ω_k is [L].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from fedagg.models.base import at_least_float32


@dataclass(frozen=True)
class Sensitivity:
    decay: float  # μ
    of: Literal["output", "loss"] = "output"
    per: Literal["parameter", "tensor"] = "parameter"

    def width(self, shapes: list[torch.Size]) -> int:
        """Values of one client's Ω: P per parameter, L per tensor."""
        return sum(s.numel() for s in shapes) if self.per == "parameter" else len(shapes)

    def targets(self, logits: Tensor, task: Tensor, real: Tensor | None) -> Tensor:
        """[g] what each of g clients differentiates: logits [g, n, (T,) C]; `task` [g] their task losses; `real`
        [g] the real samples of each batch (the rest fill it up), or None."""
        if self.of == "loss":
            return task
        g, n = logits.shape[:2]
        per = at_least_float32(logits).pow(2).sum(-1).view(g, n, -1)  # ‖f(x)‖² of every sample (and position)
        if real is None:
            return per.flatten(1).mean(1)
        keep = torch.arange(n, device=logits.device).view(1, n, 1) < real.view(g, 1, 1)
        return torch.where(keep, per, 0).flatten(1).sum(1) / (real * per.shape[2])


class StackedSensitivity:
    """Ω of k clients on stacked [k, ...] parameters, continued from each client's kept one (zero when new)."""

    def __init__(self, spec: Sensitivity, params: list[Tensor], saved: list[Tensor | None]) -> None:
        self.spec, k = spec, params[0].shape[0]
        device = params[0].device
        if spec.per == "parameter":
            self.omega = [torch.zeros_like(p) for p in params]
            sizes = [p[0].numel() for p in params]
            for i, flat in enumerate(saved):
                if flat is not None:
                    for o, part in zip(self.omega, flat.to(device).split(sizes)):
                        o[i].copy_(part.view_as(o[i]))
        else:
            self.omega = torch.zeros(k, len(params), device=device)
            for i, flat in enumerate(saved):
                if flat is not None:
                    self.omega[i].copy_(flat.to(device))

    @torch.no_grad()
    def update(self, grads: list[Tensor], clients: slice | Tensor) -> None:
        """One local step of the selected clients: grads [g, ...] of their targets."""
        mu = self.spec.decay
        if self.spec.per == "parameter":
            for o, g in zip(self.omega, grads):
                o[clients] = mu * o[clients] + (1 - mu) * g.abs()
        else:
            norms = torch.stack([g.reshape(g.shape[0], -1).pow(2).sum(1) for g in grads], dim=1)  # [g, L]
            self.omega[clients] = mu * self.omega[clients] + (1 - mu) * norms

    def flat(self) -> Tensor:
        """[k, P] or [k, L]."""
        if self.spec.per == "parameter":
            return torch.cat([o.reshape(o.shape[0], -1) for o in self.omega], dim=1)
        return self.omega.clone()
