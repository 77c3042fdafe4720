"""FedNNNN (Nagura et al. 2020) and its two ablations, Norm-Norm and Momentum.

Averaging updates that point different ways shrinks them (N = ||sum p Delta|| <= E =
sum p ||Delta||, eq. 6), so FedNNNN stretches the mean update back to beta * E (eq. 8) and
adds server momentum on top (eq. 12-13). Norm-Norm is the stretch alone (gamma = 0);
Momentum is the momentum alone (the factor beta E / N replaced by 1, eq. 10-11).
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from torch import Tensor

from fedagg.aggregators.base import AggregateResult, Aggregator, Weighting
from fedagg.aggregators.inputs import RoundInputs
from fedagg.config.constraints import Range, checked

TINY_NORM = 1e-12  # below this N the mean update has no direction to stretch (fedagg's choice)
# The paper evaluates the plain average (section 4.1, step 5) and sends clients the stretched
# model (step 6), whose own accuracy it calls "extremely poor": `evaluate: global` scores that one.
Evaluate = Literal["average", "global"]
Beta = Annotated[float, Range(gt=0, words="use a positive number (paper: 0.6 to 1.1)")]
Gamma = Annotated[float, Range(ge=0, lt=1, words="use a number in [0, 1) (paper: 0.6 to 0.9)")]


class FedNNNN(Aggregator):
    """`conf/aggregator/fednnnn.yaml`: d <- gamma d + beta (E/N) a, w <- w + d; state: d [P]."""

    @checked("aggregator.")
    def __init__(self, beta: Beta = 0.7, gamma: Gamma = 0.8, weighting: Weighting = "uniform",
                 evaluate: Evaluate = "average") -> None:
        # uniform by default: the paper's server is not told client sizes (fedagg's choice)
        super().__init__(weighting)
        self.evaluate = evaluate
        self.beta, self.gamma = float(beta), float(gamma)
        self.momentum: Tensor | None = None  # d_t, d_0 = 0

    def scale(self, mean_norm: Tensor, norm_mean: Tensor) -> Tensor:
        """beta E / N (eq. 8), or 0 when N is too small to normalise (the paper returns w as is)."""
        safe = norm_mean.clamp_min(TINY_NORM)
        return torch.where(norm_mean >= TINY_NORM, self.beta * mean_norm / safe, 0.0)

    def aggregate(self, inputs: RoundInputs) -> AggregateResult:
        global_params, client_params = inputs.global_params, inputs.client_params
        p = self.client_weights(inputs).to(client_params.dtype)
        delta = inputs.updates  # eq. 2
        a = p @ delta  # the FedAvg update
        average = global_params + a  # eq. 1: the model the paper evaluates (protocol step 5)
        n = torch.linalg.vector_norm(a)  # N, eq. 4
        e = p @ torch.linalg.vector_norm(delta, dim=1)  # E, eq. 5
        d = torch.zeros_like(global_params) if self.momentum is None else self.momentum.to(global_params)
        scale = self.scale(e, n)
        self.momentum = self.gamma * d + scale * a  # eq. 12 (Alg. 3 line 11)
        new = global_params + self.momentum  # eq. 13 (Alg. 3 line 12)
        # beta E / N: how far the mean update is stretched
        return AggregateResult(new, p, evaluated=average if self.evaluate == "average" else None,
                               metrics={"scale": float(scale)})

    def state_dict(self) -> dict:
        return {"momentum": None if self.momentum is None else self.momentum.clone()}

    def load_state_dict(self, state: dict) -> None:
        m = state["momentum"]
        self.momentum = None if m is None else m.clone()


class NormNorm(FedNNNN):
    """`conf/aggregator/normnorm.yaml`: w <- w + beta (E/N) a (eq. 8), no momentum."""

    def __init__(self, beta: Beta = 0.7, weighting: Weighting = "uniform", evaluate: Evaluate = "average") -> None:
        super().__init__(beta=beta, gamma=0.0, weighting=weighting, evaluate=evaluate)


class FedMomentum(FedNNNN):
    """`conf/aggregator/fedmomentum.yaml`: d <- gamma d + a, w <- w + d (eq. 10-11), no stretch."""

    def __init__(self, gamma: Gamma = 0.8, weighting: Weighting = "uniform", evaluate: Evaluate = "average") -> None:
        super().__init__(beta=1.0, gamma=gamma, weighting=weighting, evaluate=evaluate)

    def scale(self, mean_norm: Tensor, norm_mean: Tensor) -> Tensor:
        return torch.ones_like(norm_mean)
