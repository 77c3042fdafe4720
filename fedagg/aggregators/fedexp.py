"""FedExP (Jhunjhunwala, Wang, Joshi, ICLR 2023): an extrapolated server step.

The clients' mean update Δ̄ = (1/K) Σ_k Δ_k is applied with the step
η_g = max(1, Σ_k ‖Δ_k‖² / (2K (‖Δ̄‖² + ε))), which grows when the clients' updates
disagree (their mean is short compared with each of them). The paper evaluates the mean of
the last two global models (its iterates oscillate); clients always receive w. In round 1
there is no earlier global model to average with, and the model after the round is scored,
as the authors' code does.

Three readings of the authors' code (Divyansh03/FedExP, main.py) are options whose defaults
keep fedagg's rule: ε shrinks by `eps_decay` every round (the code: 0.998² per round, applied
before its first round too), the denominator is ‖Δ̄‖² + K ε (`eps_per_client`; the code
adds S ε, S its clients per round, to the same mean-based ratio, so fedagg's ε is K times the
code's), and Δ_k and ‖Δ_k‖² are weighted by data share (`weighting: samples`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Literal

import torch
from torch import Tensor

from fedagg.aggregators.base import AggregateResult, Aggregator, Weighting
from fedagg.aggregators.blocks import update_norms
from fedagg.aggregators.inputs import RoundInputs
from fedagg.config.constraints import Flag, Range, Tune, checked


class FedExP(Aggregator):
    """`conf/aggregator/fedexp.yaml`: w ← w + η_g Δ̄; η_g reported as agg_server_lr."""

    @checked("aggregator.")
    def __init__(self,
                 eps: Annotated[float, Range(gt=0, lt=float("inf"), words="use a finite number > 0 (the paper: 1e-3)"),
                                Tune(1e-3, 1e-1, log=True, source="Jhunjhunwala et al. 2023: eps grid 10^-3, 10^-2, 10^-1")] = 1e-3,
                 evaluate: Literal["last_two", "global"] = "last_two",
                 eps_decay: Annotated[float, Range(gt=0, le=1, words="use a number in (0, 1] (1: a fixed ε; the "
                                                                   "authors' code: 0.996004 = 0.998²)")] = 1.0,
                 eps_per_client: Annotated[bool, Flag()] = False,
                 weighting: Weighting = "uniform") -> None:
        super().__init__(weighting)  # Δ̄ is the plain mean (fedagg's choice); samples: Σ_k p_k Δ_k (the authors' code)
        self.eps, self.evaluate = float(eps), evaluate
        self.eps_decay, self.eps_per_client = float(eps_decay), eps_per_client
        self.previous: Tensor | None = None  # this round's starting model, for the tested mean

    def server_update(self, inputs: RoundInputs, update: Tensor) -> tuple[Tensor, dict[str, float]]:
        k = inputs.num_clients
        norms2 = update_norms(inputs).pow(2)  # ‖Δ_k‖²
        eps = self.eps * self.eps_decay**inputs.round  # round r uses ε d^r: the code decays before each round
        if self.eps_per_client:
            eps = k * eps  # the code's ‖Δ̄‖² + S ε
        if self.weighting == "uniform":  # Σ_k ‖Δ_k‖² / (2K (‖Δ̄‖² + ε)), as fedagg's design writes it
            lr = torch.clamp(norms2.sum() / (2 * k * (update.pow(2).sum() + eps)), min=1.0)
        else:  # Σ_k p_k ‖Δ_k‖² / (2 (‖Δ̄‖² + ε)), p the data shares the mean update used
            lr = torch.clamp((self.client_weights(inputs).to(update.dtype) * norms2).sum() / (2 * (update.pow(2).sum() + eps)), min=1.0)
        # round 1 has no earlier global model: the code scores the model after the round
        self.previous = inputs.global_params if inputs.round > 1 else None
        return inputs.global_params + lr * update, {"server_lr": lr}

    def aggregate(self, inputs: RoundInputs) -> AggregateResult:
        result = super().aggregate(inputs)
        if self.evaluate == "last_two" and self.previous is not None:
            return replace(result, evaluated=(self.previous + result.params) / 2)  # the mean of w_t and w_{t+1}
        return result
