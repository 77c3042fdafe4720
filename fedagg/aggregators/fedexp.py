"""FedExP (Jhunjhunwala, Wang, Joshi, ICLR 2023; SPEC "Drift correction"): an extrapolated server step.

The clients' mean update Δ̄ = (1/K) Σ_k Δ_k is applied with the step
η_g = max(1, Σ_k ‖Δ_k‖² / (2K (‖Δ̄‖² + ε))), which grows when the clients' updates
disagree (their mean is short compared with each of them). The paper evaluates the mean of
the last two global models (its iterates oscillate); clients always receive w.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedagg.aggregators.base import Aggregator
from fedagg.aggregators.blocks import update_norms
from fedagg.aggregators.inputs import RoundInputs

EVALUATE = ("last_two", "global")


class FedExP(Aggregator):
    """`conf/aggregator/fedexp.yaml`: w ← w + η_g Δ̄; η_g reported as agg_server_lr."""

    def __init__(self, eps: float = 1e-3, evaluate: str = "last_two") -> None:
        super().__init__("uniform")  # Δ̄ is the plain mean (SPEC)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < float("inf"):
            raise ValueError(f"aggregator.eps={eps!r} is not allowed; use a finite number > 0 (the paper: 1e-3)")
        if evaluate not in EVALUATE:
            raise ValueError(f"aggregator.evaluate={evaluate!r} is not allowed; choose one of {', '.join(EVALUATE)}")
        self.eps, self.evaluate = float(eps), evaluate
        self.previous: Tensor | None = None  # this round's starting model, for the tested mean

    def server_update(self, inputs: RoundInputs, update: Tensor) -> Tensor:
        k = inputs.num_clients
        spread = update_norms(inputs.client_params, inputs.global_params, inputs.block_rows).pow(2).sum()  # Σ_k ‖Δ_k‖²
        lr = torch.clamp(spread / (2 * k * (update.pow(2).sum() + self.eps)), min=1.0)
        self.report(server_lr=float(lr))
        self.previous = inputs.global_params
        return inputs.global_params + lr * update

    def evaluated_params(self, global_params: Tensor) -> Tensor:
        if self.evaluate == "last_two" and self.previous is not None:
            return (self.previous + global_params) / 2  # the mean of w_t and w_{t+1}
        return global_params
