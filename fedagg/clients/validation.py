"""Scoring trained client models on held-out samples: the same batches and counts in every engine.

Each client's validation indices are served in columns of `step` samples, [K, step] at a
time (padded where a client has fewer), so the sequential engine scores one client
(K = 1) in exactly the batches the parallel engine uses for a stack of one.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from fedagg.data.device import targets


class ValidationPlan:
    def __init__(self, val_indices: list[Tensor], batch_size: int) -> None:
        self.val_indices = val_indices
        sizes = [v.numel() for v in val_indices]
        self.longest = max(sizes, default=0)
        self.step = max(1, batch_size // len(val_indices))  # samples per client per forward
        device = val_indices[0].device if val_indices else torch.device("cpu")
        self.lengths = torch.tensor(sizes, device=device)  # one copy to the device for the whole plan
        # every client's indices padded to the longest with its last (a client with none: index 0), built on
        # the device once, so that no batch copies per-client positions from the host
        cols = torch.arange(self.longest, device=device)
        self.table = torch.stack([v[cols.clamp(max=n - 1)] if n else torch.zeros_like(cols)
                                  for v, n in zip(val_indices, sizes)]) if val_indices else cols.view(0, -1)
        self.real = cols.view(1, -1) < self.lengths.view(-1, 1)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        """(training-pool indices [K, b], which of them are real rather than padding [K, b])."""
        for start in range(0, self.longest, self.step):
            yield self.table[:, start:start + self.step], self.real[:, start:start + self.step]

    @staticmethod
    def correct(logits: Tensor, y: Tensor, real: Tensor) -> Tensor:
        """[K] right answers among the real samples of logits [K, b, C] against labels y [K, b] (a sequence's
        logits [K, b, T, C] against [K, b, T] count the share of its positions that are right)."""
        right = (logits.argmax(-1) == y).view(*real.shape, -1)
        if right.shape[-1] == 1:  # one label per sample: whole counts, as before sequences existed
            return (right[..., 0] & real).sum(1)
        return (right.double().mean(-1) * real).sum(1)

    def accuracy(self, correct: Tensor) -> Tensor:
        """[K] float32 accuracy from the counts (0 for a client with nothing held out)."""
        n = self.lengths.to(dtype=torch.float64)
        return torch.where(n > 0, correct.double() / n.clamp(min=1), 0.0).float()

    @staticmethod
    def counter(k: int, data, device) -> Tensor:
        """[K] zeros to add `correct` into: whole counts, or fractions for token sequences."""
        return torch.zeros(k, dtype=torch.float64 if getattr(data, "inputs", "images") == "tokens" else torch.long, device=device)


@torch.no_grad()
def score_model(model: nn.Module, data, val_idx: Tensor, batch_size: int) -> Tensor:
    """[1] accuracy of `model` as it stands on `val_idx`, in eval mode, in the batches a stack of one gets."""
    plan = ValidationPlan([val_idx], batch_size)
    correct = plan.counter(1, data, val_idx.device)
    model.eval()
    for idx, real in plan:
        logits = model(data.prepare(data.train_images(idx.reshape(-1))))
        correct += plan.correct(logits.view(1, *idx.shape[1:], *logits.shape[1:]), targets(data, "train", idx), real)
    return plan.accuracy(correct)
