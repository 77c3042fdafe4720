"""Model attacks: what the corrupted clients send instead of their trained model.

`sign_flip` sends w − s Δ_k; `gaussian` a model drawn from N(0, σ²); `alie` (Baruch et al.
2019, "A little is enough") sends w + μ − z σ, with μ and σ the per-coordinate mean and
standard deviation of the round's honest updates: small enough to pass for honest, the
same for every attacker; `ipm` (Xie et al. 2020, inner-product manipulation) sends
w − ε μ. All attackers of a round send the same update in ALIE and IPM (they collude).
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor

from fedagg.attacks.base import Attack, Fraction
from fedagg.config.constraints import Range, checked

Positive = Annotated[float, Range(gt=0, lt=float("inf"), words="use a finite number > 0")]


def honest_moments(updates: Tensor, corrupted: Tensor) -> tuple[Tensor, Tensor]:
    """Per-coordinate mean and (population) standard deviation of the honest updates; of all
    of them in a round where every participant is corrupted."""
    honest = updates[~corrupted] if bool((~corrupted).any()) else updates
    return honest.mean(dim=0), honest.std(dim=0, correction=0)


class SignFlip(Attack):
    """`attack=sign_flip`: Δ → −s Δ."""

    @checked("attack.")
    def __init__(self, fraction: Fraction = 0.2, scale: Positive = 1.0) -> None:
        super().__init__(fraction)
        self.scale = float(scale)

    def corrupt(self, global_params, client_params, corrupted, g):
        flipped = global_params - self.scale * (client_params - global_params)
        return torch.where(corrupted[:, None], flipped, client_params)


class Gaussian(Attack):
    """`attack=gaussian`: W ← N(0, σ²), drawn from the stream (seed, "attack", round)."""

    @checked("attack.")
    def __init__(self, fraction: Fraction = 0.2, sigma: Positive = 1.0) -> None:
        super().__init__(fraction)
        self.sigma = float(sigma)

    def corrupt(self, global_params, client_params, corrupted, g):
        noise = self.sigma * torch.randn(client_params.shape, generator=g).to(client_params)
        return torch.where(corrupted[:, None], noise, client_params)


def alie_z(n: int, f: int) -> float:
    """Baruch et al.'s z_max: the largest z for which s = ⌊n/2 + 1⌋ − f honest clients still lie farther out."""
    s = math.floor(n / 2 + 1) - f
    p = min(max((n - s) / n, 0.5), 1 - 1e-3)  # z >= 0, and finite when the attackers are a majority of the round
    return float(torch.special.ndtri(torch.tensor(p, dtype=torch.float64)))


class ALIE(Attack):
    """`attack=alie`: every attacker sends w + μ − z σ (z from the paper's formula, or given)."""

    @checked("attack.")
    def __init__(self, fraction: Fraction = 0.2, z: Positive | None = None) -> None:
        super().__init__(fraction)
        self.z = None if z is None else float(z)

    def corrupt(self, global_params, client_params, corrupted, g):
        updates = client_params - global_params
        mean, std = honest_moments(updates, corrupted)
        z = self.z if self.z is not None else alie_z(len(corrupted), int(corrupted.sum()))
        return torch.where(corrupted[:, None], global_params + mean - z * std, client_params)


class IPM(Attack):
    """`attack=ipm`: every attacker sends w − ε μ."""

    @checked("attack.")
    def __init__(self, fraction: Fraction = 0.2, epsilon: Positive = 0.5) -> None:
        super().__init__(fraction)
        self.epsilon = float(epsilon)

    def corrupt(self, global_params, client_params, corrupted, g):
        mean, _ = honest_moments(client_params - global_params, corrupted)
        return torch.where(corrupted[:, None], global_params - self.epsilon * mean, client_params)
