"""`attack=label_flip`: the corrupted clients' labels become C − 1 − y (a data attack)."""

from __future__ import annotations

from torch import Tensor

from fedagg.attacks.base import Attack, Fraction


class LabelFlip(Attack):
    def __init__(self, fraction: Fraction = 0.2) -> None:
        super().__init__(fraction)

    def poison_labels(self, labels: Tensor, indices: Tensor, num_classes: int) -> Tensor:
        poisoned = labels.clone()
        poisoned[indices] = num_classes - 1 - labels[indices]
        return poisoned
