"""Krum and Multi-Krum (Blanchard et al. 2017).

With f clients assumed corrupted, a client's score is the sum of squared distances from its
model to its K − f − 2 nearest other models: honest models sit close to many others.
Krum sends the lowest-scoring model; Multi-Krum averages the m lowest-scoring ones
(m = K − f by default). f is given, or ⌊attack.fraction · K⌋ each round (the YAML ties it
to the run's attack). A round of K clients needs K − f − 2 ≥ 1; for the round size that
sampling decides, this is checked against clients_per_round before training.
"""

from __future__ import annotations

import logging
from typing import Annotated

import torch
from torch import Tensor

from fedagg.aggregators.inputs import ClientSetup, RoundInputs
from fedagg.aggregators.robust import Count, RobustRule, assumed_corrupted
from fedagg.config.constraints import Range, checked

Corrupted = Annotated[int, Range(ge=0, integer=True, words="use an integer >= 0")]
Fraction = Annotated[float, Range(ge=0, lt=0.5, words="it must be in [0, 0.5)")]
log = logging.getLogger("fedagg")


def scores(models: Tensor, neighbours: int) -> Tensor:
    """[K] sum of squared distances from each model to its `neighbours` nearest others."""
    sq = (models * models).sum(dim=1)
    dist = (sq[:, None] + sq[None, :] - 2 * models @ models.T).clamp_min(0)  # ||W_i - W_j||^2
    dist.fill_diagonal_(float("inf"))  # a model is not its own neighbour
    return dist.topk(neighbours, dim=1, largest=False).values.sum(dim=1)


class Krum(RobustRule):
    """`conf/aggregator/krum.yaml`: the model with the lowest score; reported weight one-hot."""

    @checked("aggregator.")
    def __init__(self, f: Corrupted | None = None, attack_fraction: Fraction = 0.0, bucket_size: Count = 1) -> None:
        super().__init__(bucket_size)
        self.f = f
        self.attack_fraction = float(attack_fraction)

    def corrupted(self, k: int) -> int:
        return assumed_corrupted(self.f, self.attack_fraction, k)

    def check_clients(self, setup: ClientSetup) -> None:
        k = self.models_per_round(setup)  # the models the rule sees: buckets, when on
        f = self.corrupted(k)
        if k - f - 2 < 1:
            raise ValueError(f"aggregator.f={f} is not allowed with {k} models a round (clients_per_round="
                             f"{setup.clients_per_round}, bucket_size={self.bucket_size}): Krum needs K - f - 2 >= 1")

    def ranking(self, models: Tensor) -> Tensor:
        """Positions from the lowest score up (a smaller position first among ties)."""
        k = models.shape[0]
        neighbours = min(max(k - self.corrupted(k) - 2, 1), k - 1)  # a round made smaller by dropouts still ranks
        if neighbours < 1:
            return torch.zeros(1, dtype=torch.long, device=models.device)
        return torch.sort(scores(models.double(), neighbours), stable=True).indices

    def combine(self, inputs: RoundInputs, models: Tensor, num_samples: Tensor) -> tuple[Tensor, Tensor]:
        best = self.ranking(models)[0]
        weights = torch.zeros(models.shape[0], dtype=models.dtype, device=models.device)
        weights[best] = 1.0
        return models[best].clone(), weights


class MultiKrum(Krum):
    """`conf/aggregator/multikrum.yaml`: the mean of the m lowest-scoring models (m = K − f by default)."""

    @checked("aggregator.")
    def __init__(self, f: Corrupted | None = None, attack_fraction: Fraction = 0.0, m: Count | None = None,
                 bucket_size: Count = 1) -> None:
        super().__init__(f, attack_fraction, bucket_size)
        self.m = m

    def check_clients(self, setup: ClientSetup) -> None:
        super().check_clients(setup)
        k = self.models_per_round(setup)
        if self.m is not None and self.m > k:  # legal: combine takes min(m, K)
            log.warning("aggregator.m=%d is more than the %d models a round (clients_per_round=%d, bucket_size=%d): "
                        "Multi-Krum averages every one of the %d (m is clamped to K)", self.m, k, setup.clients_per_round,
                        self.bucket_size, k)

    def combine(self, inputs: RoundInputs, models: Tensor, num_samples: Tensor) -> tuple[Tensor, Tensor]:
        k = models.shape[0]
        m = min(self.m if self.m is not None else k - self.corrupted(k), k)
        chosen = self.ranking(models)[:m]
        weights = torch.zeros(k, dtype=models.dtype, device=models.device)
        weights[chosen] = 1.0 / len(chosen)
        return weights @ models, weights
