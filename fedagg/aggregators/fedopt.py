"""Server optimizers on the pseudo-gradient: FedAvgM (Hsu 2019) and FedOpt (Reddi 2021).

The clients' weighted mean update g = sum_k p_k Delta_k (the base class's `update`,
pointing up the change) is treated as a gradient step for a server optimizer with state
that persists across rounds. Only `server_update` differs from FedAvg, so the reported weights
stay the plain client weights p.

FedOpt (Reddi et al. 2021, Algorithm 2): m <- b1 m + (1-b1) g; v by the Adam, Yogi or
Adagrad rule; w <- w + lr m / (sqrt(v) + tau). Paper form: no bias correction, m starts
at 0 and v at tau^2 (Alg. 2 line 1: v_{-1} >= tau^2). `bias_correction: true` is the
Adam-style form of the FedCAMS code: m / (1 - b1^r), v / (1 - b2^r) with
r the number of server steps taken, and v starting at 0 like that code's exp_avg_sq.

The authors' own code (google-research/federated, Keras server optimizers; facts G, B of
the sources listed in conf/experiment/fedopt_table2.yaml) differs from Algorithm 2 in three ways, each an
option here so the paper's form stays the default:
- `correction: rate` puts the bias correction into the rate, lr sqrt(1 - b2^r) / (1 - b1^r),
  with tau beside the uncorrected sqrt(v) (Keras Adam, the repository's Yogi); `moments`
  (default) divides m and v themselves, tau beside sqrt(v_hat) (PyTorch Adam, FedCAMS).
  They differ only through tau: rate = moments with tau / sqrt(1 - b2^r).
- `v_init: 0.0` starts v at 0 (the authors' initial_accumulator_value); null keeps the form's
  own start (tau^2 in the paper's form, 0 with bias correction).
- Keras Adagrad has no first moment: `beta1: 0` gives m = g, exactly that step.
"""

from __future__ import annotations

import logging
from typing import Annotated, Literal

import torch
from torch import Tensor

from fedagg.aggregators.base import Aggregator, Weighting
from fedagg.aggregators.inputs import ClientSetup, RoundInputs
from fedagg.config.constraints import Flag, Range, Tune, checked

Rate = Annotated[float, Range(gt=0, words="it must be > 0")]
Beta = Annotated[float, Range(ge=0, lt=1, words="it must be in [0, 1)")]
# search ranges for the fair comparison (python -m fedagg.compare)
SERVER_LR = Tune(1e-3, 10.0, log=True, source="Reddi et al. 2021 (App. D): server rate grid 10^-3 .. 10^1")
TAU = Tune(1e-5, 1e-1, log=True, source="Reddi et al. 2021 (App. D): tau grid 10^-5 .. 10^-1")
AVGM_LR = Tune(0.1, 3.0, log=True, source="no grid in Hsu et al. 2019 (they tune the effective rate lr/(1-momentum)): a decade below 1 to 3")
AVGM_MOMENTUM = Tune(0.7, 0.99, source="Hsu et al. 2019: momentum grid 0.7, 0.9, 0.97, 0.99")
log = logging.getLogger("fedagg")
# m and v live in the model's float32 (largest 3.4e38): v must start there, and so must tau^2, v's default start
V_MAX = 1e38
Tau = Annotated[float, Range(ge=0, le=V_MAX**0.5, words=f"it must be a number in [0, {V_MAX**0.5:g}] (tau^2 starts v, "
                                                     "a float32 like the model)")]
VInit = Annotated[float | None, Range(ge=0, le=V_MAX, words=f"use a number in [0, {V_MAX:g}] (v is a float32, like the "
                                                            "model), or null for the form's own start (tau^2; 0 with "
                                                            "bias_correction)")]


def _clone(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.clone()


class FedAvgM(Aggregator):
    """`conf/aggregator/fedavgm.yaml`: b <- momentum * b + g; w <- w + lr * b (Hsu et al. 2019)."""

    weighted_mean = True  # a server optimizer on the weighted mean: post-processing of it

    @checked("aggregator.")
    def __init__(self, weighting: Weighting = "samples", lr: Annotated[Rate, AVGM_LR] = 1.0,
                 momentum: Annotated[Beta, AVGM_MOMENTUM] = 0.9) -> None:
        super().__init__(weighting)
        self.lr, self.momentum = float(lr), float(momentum)
        self.b: Tensor | None = None  # [P] server velocity; zeros before the first round

    def server_update(self, inputs: RoundInputs, update: Tensor) -> Tensor:
        b = torch.zeros_like(update) if self.b is None else self.b
        self.b = self.momentum * b + update  # velocity, no (1 - momentum) damping (Hsu 2019)
        return inputs.global_params + self.lr * self.b

    def state_dict(self) -> dict:
        return {"b": _clone(self.b)}

    def load_state_dict(self, state: dict) -> None:
        self.b = _clone(state["b"])


class FedOpt(Aggregator):
    """Adaptive server step w + lr * m / (sqrt(v) + tau); a subclass gives the v rule."""

    weighted_mean = True  # a server optimizer on the weighted mean: post-processing of it

    @checked("aggregator.")
    def __init__(
        self,
        weighting: Weighting = "samples",
        lr: Annotated[Rate, SERVER_LR] = 1e-2,
        beta1: Beta = 0.9,
        beta2: Beta = 0.99,
        tau: Annotated[Tau, TAU] = 1e-3,
        bias_correction: Annotated[bool, Flag()] = False,
        correction: Literal["moments", "rate"] = "moments",
        v_init: VInit = None,
    ) -> None:
        super().__init__(weighting)
        self.lr, self.beta1, self.beta2, self.tau = float(lr), float(beta1), float(beta2), float(tau)
        self.bias_correction, self.correction = bias_correction, correction
        self.v_init = (0.0 if bias_correction else self.tau**2) if v_init is None else float(v_init)
        self.m: Tensor | None = None  # [P] first moment
        self.v: Tensor | None = None  # [P] second moment
        self.steps = 0  # server steps taken: r of the bias correction

    def check_clients(self, setup: ClientSetup) -> None:
        super().check_clients(setup)
        if self.correction == "rate" and not self.bias_correction:  # legal, but both forms then take one step
            log.warning("aggregator.correction=rate does nothing with aggregator.bias_correction=false: the two "
                        "corrections differ only in where they correct the bias; set aggregator.bias_correction=true "
                        "for the FedOpt authors' Keras form")

    def second_moment(self, v: Tensor, g2: Tensor) -> Tensor:
        """v after one squared pseudo-gradient g2 = g^2 (Alg. 2 lines 12-14)."""
        raise NotImplementedError

    def advance(self, update: Tensor) -> tuple[float, float]:
        """One optimizer step on g = update; returns the bias-correction divisors of m and v."""
        if self.m is None:
            self.m = torch.zeros_like(update)
            self.v = torch.full_like(update, self.v_init)
        self.steps += 1
        self.m = self.beta1 * self.m + (1 - self.beta1) * update  # Alg. 2 line 11
        self.v = self.second_moment(self.v, update * update)  # Alg. 2 lines 12-14
        if not self.bias_correction:
            return 1.0, 1.0
        return 1 - self.beta1**self.steps, 1 - self.beta2**self.steps

    def server_update(self, inputs: RoundInputs, update: Tensor) -> Tensor:
        c1, c2 = self.advance(update)
        # With tau = 0 an element whose g was always 0 has v = 0 and m = 0: clamping the
        # denominator to the smallest normal float makes that step 0 and changes no other.
        tiny = torch.finfo(update.dtype).tiny
        if self.correction == "rate":  # Keras: lr_t = lr sqrt(c2) / c1, tau beside the raw sqrt(v)
            denom = (self.v.sqrt() + self.tau).clamp_min(tiny)
            return inputs.global_params + (self.lr * c2**0.5 / c1) * self.m / denom
        denom = ((self.v / c2).sqrt() + self.tau).clamp_min(tiny)
        return inputs.global_params + self.lr * (self.m / c1) / denom  # Alg. 2 line 15

    def state_dict(self) -> dict:
        return {"m": _clone(self.m), "v": _clone(self.v), "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.m, self.v = _clone(state["m"]), _clone(state["v"])
        self.steps = int(state["steps"])


class FedAdam(FedOpt):
    """`conf/aggregator/fedadam.yaml`."""

    def second_moment(self, v: Tensor, g2: Tensor) -> Tensor:
        return self.beta2 * v + (1 - self.beta2) * g2  # Alg. 2 line 14


class FedYogi(FedOpt):
    """`conf/aggregator/fedyogi.yaml`."""

    def second_moment(self, v: Tensor, g2: Tensor) -> Tensor:
        return v - (1 - self.beta2) * g2 * torch.sign(v - g2)  # Alg. 2 line 13


class FedAdagrad(FedOpt):
    """`conf/aggregator/fedadagrad.yaml` (beta2 is used only by bias_correction)."""

    def second_moment(self, v: Tensor, g2: Tensor) -> Tensor:
        return v + g2  # Alg. 2 line 12
