"""Client-level differential privacy (`channel=dp`; DP-FedAvg, McMahan et al. 2018).

Each update is clipped, Δ_k · min(1, S/‖Δ_k‖); the server's uniform mean gets N(0, (zS/K)² I).
The simulation adds that one noise vector to every clipped row: any mean whose weights sum
to one (uniform: 1/K) then holds it exactly once, and the aggregator stays unaware of it.
Server optimizers step on the noised mean (post-processing). Adaptive clipping (Andrew et
al. 2021): S ← S · exp(−η_C (b̄ − γ)), b̄ the share of clients with ‖Δ_k‖ ≤ S plus N(0, σ_b²/K²).

ε after each round comes from the RDP accountant of Google's `dp-accounting` (the optional
extra `fedagg[dp]`), for the Poisson-subsampled Gaussian at q = K/N (SPEC). With adaptive
clipping the count's noise is a second Gaussian query each round: the two compose to one
with noise multiplier (z⁻² + σ_b⁻²)^(-1/2) (Andrew et al. 2021, section 3).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated

import torch
from torch import Tensor

from fedagg.channel.base import Stage
from fedagg.config.constraints import Flag, Range, checked

if TYPE_CHECKING:
    from fedagg.aggregators.base import Aggregator

NonNegative = Annotated[float, Range(ge=0, lt=float("inf"), words="use a finite number >= 0")]
Positive = Annotated[float, Range(gt=0, lt=float("inf"), words="use a finite number > 0")]
Quantile = Annotated[float, Range(gt=0, lt=1, words="it must be in (0, 1)")]
Delta = Annotated[float, Range(gt=0, lt=1, words="it must be in (0, 1)")]


def epsilon(q: float, noise_multiplier: float, rounds: int, delta: float) -> float:
    """ε of `rounds` Poisson-subsampled Gaussian mechanisms (rate q, noise multiplier z), RDP accountant."""
    from dp_accounting import dp_event, rdp  # optional: checked before training by DP.check

    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    acc = rdp.RdpAccountant()
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(noise_multiplier)), rounds)
    return float(acc.get_epsilon(delta))


class DP(Stage):
    """`channel=dp`: clip each Δ_k to S, add N(0, (zS/K)²) to the mean; ε each round."""

    privatises = True

    @checked("channel.dp.")
    def __init__(self, noise_multiplier: NonNegative = 1.0, clip: Positive = 1.0,
                 adaptive: Annotated[bool, Flag()] = False, target_quantile: Quantile = 0.5,
                 clip_lr: Positive = 0.2, count_noise: Positive | None = None, delta: Delta | None = None) -> None:
        self.z, self.clip, self.adaptive = float(noise_multiplier), float(clip), bool(adaptive)
        self.target_quantile, self.clip_lr = float(target_quantile), float(clip_lr)
        self.count_noise = None if count_noise is None else float(count_noise)  # σ_b; null: K/20 (Andrew et al.)
        self.delta = None if delta is None else float(delta)
        self.rate: float | None = None  # q = K/N, set by check
        self.rounds = 0
        self.last: dict[str, float] = {}

    def check(self, aggregator: Aggregator, num_clients: int, per_round: int) -> None:
        name = type(aggregator).__name__
        if not aggregator.weighted_mean:
            raise ValueError(f"channel=dp is not allowed with aggregator {name}: its rule is not a weighted mean with "
                             "data-independent weights, so noise on that mean does not make it private; use fedavg, "
                             "fedavgm, fedadam, fedyogi, fedadagrad or fedams")
        if aggregator.weighting != "uniform":  # every weighted-mean rule takes FedAvg's weighting
            raise ValueError(f"aggregator.weighting={aggregator.weighting} is not allowed with channel=dp: the noise "
                             "is scaled for the uniform mean (SPEC); set aggregator.weighting=uniform")
        try:
            import dp_accounting  # noqa: F401
        except ImportError:
            raise ValueError("channel=dp needs the dp-accounting package for its privacy accountant: "
                             "pip install 'fedagg[dp]' (or pip install dp-accounting)") from None
        self.rate = per_round / num_clients
        if self.delta is None:
            self.delta = 1 / num_clients**1.1

    def effective_multiplier(self, k: int) -> float:
        """The noise multiplier of the round's whole release (the update, and the clipped count if adaptive)."""
        if not self.adaptive or self.z == 0:
            return self.z
        return (self.z**-2 + self.sigma_b(k) ** -2) ** -0.5

    def sigma_b(self, k: int) -> float:
        return self.count_noise if self.count_noise is not None else k / 20

    def compress(self, u: Tensor, g: torch.Generator) -> Tensor:
        k, s = u.shape[0], self.clip
        norms = torch.linalg.vector_norm(u, dim=1, keepdim=True)
        clipped = u * (s / norms).clamp(max=1.0)  # ‖Δ_k‖ = 0 gives inf, clamped to 1
        noise = torch.randn(u.shape[1], generator=g, dtype=torch.float64).to(u) * (self.z * s / k)
        if self.adaptive:
            below = float((norms <= s).to(torch.float64).mean())
            b = below + float(torch.randn((), generator=g, dtype=torch.float64)) * self.sigma_b(k) / k
            self.clip = s * math.exp(-self.clip_lr * (b - self.target_quantile))
        self.rounds += 1
        eps = epsilon(self.rate if self.rate is not None else 1.0, self.effective_multiplier(k), self.rounds,
                      self.delta if self.delta is not None else 1e-5)
        self.last = {"dp_epsilon": eps, "dp_clip": s}
        return clipped + noise

    def metrics(self) -> dict[str, float]:
        return dict(self.last)

    def state_dict(self) -> dict:
        return {"clip": self.clip, "rounds": self.rounds}

    def load_state_dict(self, state: dict) -> None:
        self.clip, self.rounds = float(state["clip"]), int(state["rounds"])
