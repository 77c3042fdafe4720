"""One client's share of the training pool."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class ClientData:
    """A client's training and held-out validation samples, as index tensors on the data's device."""

    id: int
    train_idx: Tensor
    val_idx: Tensor

    @property
    def num_samples(self) -> int:
        return int(self.train_idx.numel())
