"""Compressors C(u) on each client's row u [P].

Each is a stage of the chain on the updates; `error_feedback: true` in its options has the chain
wrap it in `ErrorFeedback` (fedagg.channel.feedback: a client sends C(e_k + Δ_k) and keeps
e_k ← u − C(u) by its id); without, it sends C(Δ_k). Bits are what one client uploads.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch
from torch import Tensor

from fedagg.channel.base import Compressor
from fedagg.config.constraints import Flag, Range, checked

Ratio = Annotated[float, Range(gt=0, le=1, words="it must be in (0, 1]")]
EF = Annotated[bool, Flag()]


def kept(ratio: float, num_params: int, rounding: str = "ceil") -> int:
    """k = ⌈ρP⌉, or ⌊ρP⌋ with rounding="floor" (FedCAMS's reference code); at least one entry."""
    k = round(ratio * num_params, 9)  # round: 0.01 * 300 is 3.0000000000000004
    return max(1, math.floor(k) if rounding == "floor" else math.ceil(k))


def index_bits(num_params: int) -> int:
    """⌈log2 P⌉ bits name one of P entries."""
    return (num_params - 1).bit_length()


class TopK(Compressor):
    """`channel=topk`: the ⌈ρP⌉ (or ⌊ρP⌋) largest-magnitude entries of u; ties go to the lower index."""

    @checked("channel.topk.")
    def __init__(self, ratio: Ratio = 0.01, error_feedback: EF = True,
                 rounding: Literal["ceil", "floor"] = "ceil") -> None:
        self.ratio, self.error_feedback, self.rounding = float(ratio), bool(error_feedback), rounding

    def compress(self, u: Tensor, g: torch.Generator) -> Tensor:
        k = kept(self.ratio, u.shape[1], self.rounding)
        # a stable sort of -|u| puts equal magnitudes in index order: ties are broken the same way everywhere
        keep = torch.sort(-u.abs(), dim=1, stable=True).indices[:, :k]
        return torch.zeros_like(u).scatter(1, keep, u.gather(1, keep))

    def bits_up(self, num_params: int) -> int:
        return kept(self.ratio, num_params, self.rounding) * (32 + index_bits(num_params))


class RandK(Compressor):
    """`channel=randk`: ⌈ρP⌉ entries drawn uniformly without replacement, scaled by P/k (unbiased)."""

    @checked("channel.randk.")
    def __init__(self, ratio: Ratio = 0.01, error_feedback: EF = False) -> None:
        self.ratio, self.error_feedback = float(ratio), bool(error_feedback)

    def compress(self, u: Tensor, g: torch.Generator) -> Tensor:
        p = u.shape[1]
        k = kept(self.ratio, p)
        keep = torch.stack([torch.randperm(p, generator=g)[:k] for _ in range(u.shape[0])]).to(u.device)
        return torch.zeros_like(u).scatter(1, keep, u.gather(1, keep) * (p / k))

    def bits_up(self, num_params: int) -> int:
        return kept(self.ratio, num_params) * 32 + 32  # the values and the seed that names their places


class Sign(Compressor):
    """`channel=sign`: ‖u‖₁ / P · sign(u) (scaled sign, Bernstein et al. 2018; EF-SignSGD)."""

    @checked("channel.sign.")
    def __init__(self, error_feedback: EF = True) -> None:
        self.error_feedback = bool(error_feedback)

    def compress(self, u: Tensor, g: torch.Generator) -> Tensor:
        return torch.sign(u) * u.abs().sum(dim=1, keepdim=True) / u.shape[1]

    def bits_up(self, num_params: int) -> int:
        return num_params + 32


class QSGD(Compressor):
    """`channel=qsgd` (Alistarh et al. 2017): u_i → ‖u‖₂ sign(u_i) ξ_i, ξ_i the stochastic rounding of
    s|u_i|/‖u‖₂ to a neighbouring multiple of 1/s (unbiased)."""

    rowwise = False  # one torch.rand over the whole [K, P]: in row blocks the draws would differ

    @checked("channel.qsgd.")
    def __init__(self, levels: Annotated[int, Range(ge=1, integer=True, words="it must be an integer >= 1")] = 4,
                 error_feedback: EF = False) -> None:
        self.levels, self.error_feedback = int(levels), bool(error_feedback)

    def compress(self, u: Tensor, g: torch.Generator) -> Tensor:
        norm = torch.linalg.vector_norm(u, dim=1, keepdim=True)
        scaled = self.levels * u.abs() / torch.where(norm > 0, norm, 1.0)
        low = scaled.floor()
        up = torch.rand(u.shape, generator=g).to(u) < (scaled - low)  # round up with probability of the remainder
        return norm * torch.sign(u) * (low + up.to(u)) / self.levels

    def bits_up(self, num_params: int) -> int:
        return 32 + num_params * (1 + self.levels.bit_length())  # the norm; a sign and ⌈log2(s + 1)⌉ bits per entry
