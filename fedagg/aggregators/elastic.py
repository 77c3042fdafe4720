"""Elastic aggregation (Chen et al., CVPR 2023; no authors' code found).

Each client keeps a per-parameter sensitivity during local training, Ω_k ← μ Ω_k + (1 − μ) |∂‖f(x)‖²₂/∂θ| at
every local step (no labels; kept per client id across rounds, zero before its first step; measured by
local training as this method's declared need, fedagg/clients/sensitivity.py). The server takes
Ω = Σ_k p_k Ω_k, ζ = 1 + τ − Ω / max(Ω) (element-wise, the max over all parameters) and moves
w ← w + ζ ⊙ Σ_k p_k Δ_k: parameters the clients' outputs are sensitive to move less (ζ down to τ), the
others up to 1 + τ times FedAvg's step. fedagg's design writes the step θ ← θ − ζ ⊙ Σ p_k Δ_k with the paper's Δ_k,
the client's change from θ to its model counted the other way (θ − θ_k, as FL-bench's `diff`); with
fedagg's own Δ_k = W_k − w that is the step above.

`variant: fl_bench` is a benchmark's reading (KarhouTam/FL-bench@06e658b src/client/elastic.py:11-60,
src/server/elastic.py:11-51), not the paper's: the sensitivity of the supervised loss, one scalar
‖∂ℓ/∂θ_i‖² per parameter tensor i, and the max over the clients instead of over the parameters. FL-bench
measures it on a 30% share of each client's data held out of training, before training; fedagg measures
it on the training batches as they are trained on (no share is held out).
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch

from fedagg.aggregators.base import Aggregator, Weighting
from fedagg.aggregators.inputs import Bits, Needs, RoundInputs, dense
from fedagg.clients.sensitivity import Sensitivity
from fedagg.config.constraints import Range, Tune, checked

TINY = 1e-30  # a max of zero (no sensitivity at all) gives Ω / max = 0 rather than 0 / 0


class Elastic(Aggregator):
    @checked("aggregator.")
    def __init__(self,
                 tau: Annotated[float, Range(ge=0, finite=True),
                                Tune(0.1, 1.0, source="around Chen et al. 2023's tau = 0.5: zeta then spans "
                                                      "[tau, 1 + tau]")] = 0.5,
                 mu: Annotated[float, Range(ge=0, lt=1, words="it must be in [0, 1)"),
                               Tune(0.5, 0.99, source="around Chen et al. 2023's mu = 0.95: a memory of 2 to 100 "
                                                      "local steps")] = 0.95,
                 variant: Literal["paper", "fl_bench"] = "paper",
                 weighting: Weighting = "samples") -> None:
        super().__init__(weighting)
        self.tau, self.mu, self.variant = float(tau), float(mu), variant
        spec = Sensitivity(self.mu) if variant == "paper" else Sensitivity(self.mu, of="loss", per="tensor")
        self.needs = Needs(sensitivity=spec)

    def bits(self, num_params: int) -> Bits:
        """The paper's clients send Ω_k [P] beside their model; FL-bench's one scalar per tensor (not counted)."""
        if self.variant == "fl_bench":
            return super().bits(num_params)
        return Bits(down=dense(num_params), up=2 * dense(num_params), beside_model=dense(num_params))

    def zeta(self, inputs: RoundInputs, weights: torch.Tensor) -> torch.Tensor:
        """ζ [P] from the participants' sensitivities."""
        omega = inputs.need("sensitivity").to(weights)  # [K, P], or [K, L] per tensor
        pooled = weights @ omega
        if self.variant == "paper":
            return 1 + self.tau - pooled / pooled.max().clamp(min=TINY)
        per_tensor = 1 + self.tau - pooled / omega.max(dim=0).values.clamp(min=TINY)  # [L]
        sizes = [s.stop - s.start for s in inputs.layout.slices]
        return per_tensor.repeat_interleave(torch.tensor(sizes, device=per_tensor.device))

    def server_update(self, inputs: RoundInputs, update: torch.Tensor):
        zeta = self.zeta(inputs, self.client_weights(inputs).to(inputs.client_params.dtype))
        return inputs.global_params + zeta * update, {"zeta_mean": zeta.mean(), "zeta_min": zeta.min()}
