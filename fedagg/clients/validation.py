"""Scoring trained client models on held-out samples: the same batches and counts in every engine.

Each client's validation indices are served in columns of `step` samples, [K, step] at a
time (padded where a client has fewer), so the sequential engine scores one client
(K = 1) in exactly the batches the parallel engine uses for a stack of one.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn


class ValidationPlan:
    def __init__(self, val_indices: list[Tensor], batch_size: int) -> None:
        self.val_indices = val_indices
        self.lengths = torch.tensor([v.numel() for v in val_indices])
        self.step = max(1, batch_size // len(val_indices))  # samples per client per forward

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        """(training-pool indices [K, b], which of them are real rather than padding [K, b])."""
        longest = int(self.lengths.max()) if len(self.val_indices) else 0
        for start in range(0, longest, self.step):
            cols = torch.arange(start, min(start + self.step, longest))
            real = cols.view(1, -1) < self.lengths.view(-1, 1)
            idx = torch.stack([v[cols.clamp(max=max(v.numel() - 1, 0)).to(v.device)] if v.numel() else
                               torch.zeros(len(cols), dtype=torch.long, device=v.device) for v in self.val_indices])
            yield idx, real.to(idx.device)

    @staticmethod
    def correct(logits: Tensor, y: Tensor, real: Tensor) -> Tensor:
        """[K] right answers among the real samples of logits [K, b, C] against labels y [K, b]."""
        return ((logits.argmax(-1) == y) & real).sum(1)

    def accuracy(self, correct: Tensor) -> Tensor:
        """[K] float32 accuracy from the counts (0 for a client with nothing held out)."""
        n = self.lengths.to(device=correct.device, dtype=torch.float64)
        return torch.where(n > 0, correct.double() / n.clamp(min=1), 0.0).float()


@torch.no_grad()
def score_model(model: nn.Module, data, val_idx: Tensor, batch_size: int) -> Tensor:
    """[1] accuracy of `model` as it stands on `val_idx`, in eval mode, in the batches a stack of one gets."""
    plan = ValidationPlan([val_idx], batch_size)
    correct = torch.zeros(1, dtype=torch.long, device=val_idx.device)
    model.eval()
    for idx, real in plan:
        logits = model(data.prepare(data.train_x[idx.reshape(-1)]))
        correct += plan.correct(logits.view(1, idx.shape[1], -1), data.train_y[idx], real)
    return plan.accuracy(correct)
