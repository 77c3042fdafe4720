"""Client-level differential privacy (`channel=dp`; DP-FedAvg, McMahan et al. 2018).

The client side clips each update, Δ_k · min(1, S/‖Δ_k‖), and each client tells whether its
update was within S; the server side adds N(0, (zS/K)² I) once to the aggregator's uniform mean
of the clipped updates (`Stage.server`, before the server optimizer: the optimizer's step is
post-processing). Adaptive clipping (Andrew et al. 2021), on the server side as well:
S ← S · exp(−η_C (b̄ − γ)), b̄ the share of clients with ‖Δ_k‖ ≤ S plus N(0, σ_b²/K²). Both
draws come from the stage's stream generator(seed, "channel", n, round): the noise vector
first, then the count's noise.

ε after each round comes from the RDP accountant of Google's `dp-accounting` (the optional
extra `fedagg[dp]`), each round its own Poisson-subsampled Gaussian (`fedagg.channel.accounting`)
at rate q = K over the clients that can be sampled (fedagg's choice), or, where a system takes clients offline,
K over those online that round. With adaptive clipping the count's noise is a second Gaussian query
each round: the two compose to one with noise multiplier (z⁻² + σ_b⁻²)^(-1/2) (Andrew et al. 2021,
section 3), and σ_b = K/20 by default makes it depend on the round's K.
"""

from __future__ import annotations

import logging
import math
from typing import Annotated

import torch
from torch import Tensor

from fedagg.channel.accounting import Accountant, epsilon
from fedagg.channel.base import Setup, Stage, Upload
from fedagg.config.constraints import Flag, Range, checked

__all__ = ["DP", "epsilon"]
log = logging.getLogger(__name__)

# The accountant squares a noise multiplier and divides by it, which overflows near 1e±154; well before that
# the numbers stop meaning anything: at z = 1e-4 one round gives ε ≈ 5.5e7, and at 1e4 the noise is ten
# thousand times what one client's clipped update can change. The count's noise σ_b is bounded alike.
NoiseMultiplier = Annotated[float, Range(ge=1e-4, le=1e4, also=(0, 0.0), words=(
    "use 0 (no noise: ε = ∞) or a number in [0.0001, 10000]: below, one round already gives ε above 10^7; above, "
    "the noise drowns every update"))]
CountNoise = Annotated[float, Range(ge=1e-4, le=1e4, words=(
    "use a number in [0.0001, 10000], or null for K/20 (Andrew et al.): below, the count is released almost "
    "exactly and one round gives ε above 10^7; above, the count tells the bound nothing"))]
# one round multiplies S by up to exp(η_C) without the count's noise: e^10 ≈ 22,000 at the bound
ClipRate = Annotated[float, Range(gt=0, le=10, words=(
    "it must be a number in (0, 10]: one round multiplies the clipping bound by up to exp(clip_lr) "
    "(Andrew et al.: 0.2)"))]
Positive = Annotated[float, Range(gt=0, lt=float("inf"), words="use a finite number > 0")]
Quantile = Annotated[float, Range(gt=0, lt=1, words="it must be in (0, 1)")]
Delta = Annotated[float, Range(gt=0, lt=1, words="it must be in (0, 1)")]
# the adaptive bound stays a positive normal float: 0 would clip 0/0, inf would add infinite noise
LOWEST_CLIP, HIGHEST_CLIP = 2.0**-1000, 2.0**1000


class DP(Stage):
    """`channel=dp`: clip each Δ_k to S (client side), add N(0, (zS/K)²) once to the mean (server side); ε each
    round."""

    privatises = True
    needs_uniform_mean = True

    @checked("channel.dp.")
    def __init__(self, noise_multiplier: NoiseMultiplier = 1.0, clip: Positive = 1.0,
                 adaptive: Annotated[bool, Flag()] = False, target_quantile: Quantile = 0.5,
                 clip_lr: ClipRate = 0.2, count_noise: CountNoise | None = None, delta: Delta | None = None) -> None:
        self.z, self.clip, self.adaptive = float(noise_multiplier), float(clip), bool(adaptive)
        self.target_quantile, self.clip_lr = float(target_quantile), float(clip_lr)
        self.count_noise = None if count_noise is None else float(count_noise)  # σ_b; null: K/20 (Andrew et al.)
        self.delta = None if delta is None else float(delta)
        self.rate: float | None = None  # q = K / the clients that can be sampled, set by check
        self.per_round: int | None = None
        self.accountant = Accountant()
        self.last: dict[str, float] = {}
        self.bound_reached = False
        self.said: list[str] = []  # start-up lines (`notes`)
        self.within = 1.0  # this round's share of clients whose update was within S (the client side's bits)

    @property
    def rounds(self) -> int:
        return len(self.accountant)

    def check(self, setup: Setup) -> None:
        rule = setup.rule
        name = rule.shown
        if rule.compresses_uploads:
            twin = f"; {rule.same_uncompressed} channel=[sign,dp] compresses before dp" if rule.same_uncompressed else ""
            raise ValueError(f"channel=dp is not allowed with {name}: it compresses each update after dp has clipped "
                             f"it and added the noise, which must reach the mean unchanged{twin}")
        if not rule.weighted_mean:
            raise ValueError(f"channel=dp is not allowed with {name}: its rule is not a weighted mean with "
                             "data-independent weights, so noise on that mean does not make it private; use fedavg, "
                             "fedavgm, fedadam, fedyogi, fedadagrad or fedams")
        if setup.sampler:
            raise ValueError(f"channel=dp is not allowed with {setup.sampler}: the privacy accountant's q = K / pool "
                             "assumes every client is sampled uniformly at random each round, which this sampler "
                             "does not do; use sampler=uniform")
        if rule.weighting != "uniform":  # every weighted-mean rule takes FedAvg's weighting
            raise ValueError(f"aggregator.weighting={rule.weighting} is not allowed with channel=dp: the noise "
                             "is scaled for the uniform mean; set aggregator.weighting=uniform")
        try:
            import dp_accounting  # noqa: F401
        except ImportError:
            raise ValueError("channel=dp needs the dp-accounting package for its privacy accountant: "
                             "pip install 'fedagg[dp]' (or pip install dp-accounting)") from None
        self.rate, self.per_round = min(1.0, setup.per_round / setup.pool), setup.per_round
        if self.delta is None:
            self.delta = 1 / setup.num_clients**1.1
        self.said = []
        if setup.online_varies:
            self.said.append("channel=dp: clients go offline, so each round's ε counts q = min(1, K / the clients online "
                             "that round), the chance an online client is sampled, an upper bound for every client")
        if self.adaptive and self.z > 0:
            k = setup.per_round
            alone, with_count = (epsilon(self.rate, z, 1, self.delta) for z in (self.z, self.effective_multiplier(k)))
            sigma = f"count_noise={self.count_noise:g}" if self.count_noise is not None else f"count_noise=null: K/20 = {k / 20:g}"
            times = f" ({with_count / alone:.1f}x)" if alone > 0 else ""
            self.said.append(f"channel.dp.adaptive=true: the clipped count ({sigma}) is released too, so one round at "
                             f"K={k} gives ε={with_count:.4g} where the update alone gives {alone:.4g}{times}; a larger "
                             f"channel.dp.count_noise costs less")

    def notes(self) -> list[str]:
        return list(self.said)

    def effective_multiplier(self, k: int) -> float:
        """The noise multiplier of the round's whole release (the update, and the clipped count if adaptive)."""
        if not self.adaptive or self.z == 0:
            return self.z
        return (self.z**-2 + self.sigma_b(k) ** -2) ** -0.5

    def sigma_b(self, k: int) -> float:
        return self.count_noise if self.count_noise is not None else k / 20

    def client(self, u: Tensor, up: Upload, g: torch.Generator) -> Tensor:
        """Each row clipped to S; the share of rows within S is what the clients' bits tell the server."""
        norms = torch.linalg.vector_norm(u, dim=1, keepdim=True)
        self.within = float((norms <= self.clip).to(torch.float64).mean())
        return u * (self.clip / norms).clamp(max=1.0)  # ‖Δ_k‖ = 0 gives inf, clamped to 1

    def server(self, mean: Tensor, up: Upload, g: torch.Generator) -> Tensor:
        """The uniform mean of the clipped rows with N(0, (zS/K)² I) added once; the round's release accounted."""
        k, s = up.num_clients, self.clip
        noise = torch.randn(mean.shape[0], generator=g, dtype=torch.float64).to(mean) * (self.z * s / k)
        if self.adaptive:
            b = self.within + float(torch.randn((), generator=g, dtype=torch.float64)) * self.sigma_b(k) / k
            self.clip = self.next_clip(s, b)
        q = up.rate if up.rate is not None else (self.rate if self.rate is not None else 1.0)
        self.accountant.compose(min(1.0, q), self.effective_multiplier(k))
        self.last = {"dp_epsilon": self.accountant.epsilon(self.delta if self.delta is not None else 1e-5), "dp_clip": s}
        return mean + noise

    def next_clip(self, s: float, b: float) -> float:
        """S · exp(−η_C (b − γ)), kept a positive normal float (a noisy count far from γ could leave that range)."""
        step = -self.clip_lr * (b - self.target_quantile)
        nxt = s * math.exp(step) if step < 700 else math.inf
        if LOWEST_CLIP <= nxt <= HIGHEST_CLIP:
            return nxt
        if not self.bound_reached:
            self.bound_reached = True
            log.warning("channel.dp: the adaptive clipping bound left the range of numbers it can take (round %d: "
                        "S = %g); it stays at %g. clip_lr=%g with count_noise=%s moves it too far a round",
                        self.rounds + 1, nxt, LOWEST_CLIP if nxt < LOWEST_CLIP else HIGHEST_CLIP, self.clip_lr,
                        "null" if self.count_noise is None else f"{self.count_noise:g}")
        return min(max(nxt, LOWEST_CLIP), HIGHEST_CLIP)

    def metrics(self) -> dict[str, float]:
        return dict(self.last)

    def state_dict(self) -> dict:
        return {"clip": self.clip, "rounds": self.rounds, "events": [list(e) for e in self.accountant.events]}

    def load_state_dict(self, state: dict) -> None:
        self.clip = float(state["clip"])
        if "events" in state:
            self.accountant = Accountant([(q, z) for q, z in state["events"]])
            return
        # A checkpoint from before the per-round events kept only the count: that accountant composed every round
        # as the latest event (at the configured rate), so the rounds before it are taken as that event again.
        k = self.per_round if self.per_round is not None else 1
        rate = self.rate if self.rate is not None else 1.0
        self.accountant = Accountant([(rate, self.effective_multiplier(k))] * int(state["rounds"]))
