"""FedDecorr (Shi et al., ICLR 2023; bytedance/FedDecorr@973e4af): decorrelating the representation's
dimensions, `client/objective=feddecorr`.

ẑ = h standardised per dimension over the batch (mean 0, unbiased variance, ε = 1e-8 inside the square
root), G = ẑᵀẑ; ℓ = CE + β · L_dec. `scale: batch` (the authors' code, fedagg's choice): L_dec = mean of the
off-diagonal entries of G², divided by the batch size N; `scale: paper` (the paper's (1/d²)‖K‖²_F, about N
times smaller): L_dec = ‖G/N‖²_F / d². A batch of one sample adds 0.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch

from fedagg.clients.objectives import Objective, Sees, Seen
from fedagg.config.constraints import Range, Tune, checked
from fedagg.models.base import at_least_float32

EPS = 1e-8


class FedDecorr(Objective):
    sees = Sees(representation=True)

    @checked("client.objective.")
    def __init__(self,
                 beta: Annotated[float, Range(ge=0, finite=True),
                                 Tune(0.01, 0.3, log=True,
                                      source="Shi et al. 2023: beta = 0.1 (CIFAR-10, Tiny-ImageNet), 0.05 (CIFAR-100);"
                                             " a decade below to three times above")] = 0.1,
                 scale: Literal["batch", "paper"] = "batch") -> None:
        self.beta, self.scale = float(beta), scale

    def forward_term(self, seen: Seen) -> torch.Tensor | None:
        h = at_least_float32(seen.local.features.flatten(0, -2))  # a sequence model's positions count as samples
        n, d = h.shape
        if n == 1:
            return None
        h = h - h.mean(0, keepdim=True)
        h = h / torch.sqrt(EPS + h.var(0, keepdim=True))
        gram = h.T @ h
        if self.scale == "paper":
            return self.beta * (gram / n).pow(2).sum() / d**2
        off = gram.pow(2).sum() - gram.diagonal().pow(2).sum()
        return self.beta * off / (d * (d - 1)) / n
