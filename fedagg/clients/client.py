"""One client's share of the training pool."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class ClientData:
    """A client's training, held-out validation and local test samples, as index tensors on the data's device."""

    id: int
    train_idx: Tensor
    val_idx: Tensor
    test_idx: Tensor | None = None  # scored by the global model when eval.per_client is on

    @property
    def num_samples(self) -> int:
        return int(self.train_idx.numel())
