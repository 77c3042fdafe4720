"""`attack=none`, and what every attack shares.

A fixed set of ⌊fraction · N⌋ client ids, drawn once from the stream (seed, "attack") and
listed in summary.json, is corrupted whenever sampled. A data attack changes those
clients' labels once, before training, so both engines train on them (and their own
validation split and label histogram show them too). A model attack replaces the models
those clients send, after local training and before aggregation.
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from fedagg.config.constraints import Range, checked
from fedagg.seeding import generator

# a majority of corrupted clients is beyond what any aggregation rule can be asked to survive
Fraction = Annotated[float, Range(ge=0, lt=0.5, words="it must be in [0, 0.5): a majority of corrupted clients is "
                                                      "beyond what any aggregation rule can be asked to survive")]


class Attack:
    """No corrupted client."""

    @checked("attack.")
    def __init__(self, fraction: Fraction = 0.0) -> None:
        self.fraction = float(fraction)

    def corrupted_clients(self, seed: int, num_clients: int) -> list[int]:
        """The corrupted ids, ascending: the same for every aggregator of this seed."""
        count = int(self.fraction * num_clients)
        return sorted(torch.randperm(num_clients, generator=generator(seed, "attack"))[:count].tolist())

    def poison_labels(self, labels: Tensor, indices: Tensor, num_classes: int) -> Tensor:
        """The training pool's labels with the corrupted clients' samples (`indices`) changed."""
        return labels

    def corrupt(self, global_params: Tensor, client_params: Tensor, corrupted: Tensor, g: torch.Generator) -> Tensor:
        """The models the round's clients send [K, P]; `corrupted` [K] marks the attackers."""
        return client_params
