"""Accuracy and mean loss of a model over batches, without gradients."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[tuple[Tensor, Tensor]]) -> tuple[float, float]:
    """(accuracy in 0-1, mean cross-entropy); (0.0, nan) for no data."""
    model.eval()
    correct = torch.zeros((), dtype=torch.long)
    loss_sum = torch.zeros(())
    count = 0
    for x, y in batches:
        logits = model(x)
        correct = correct.to(y.device) + (logits.argmax(1) == y).sum()
        loss_sum = loss_sum.to(y.device) + F.cross_entropy(logits.float(), y, reduction="sum")
        count += y.numel()
    if count == 0:
        return 0.0, float("nan")
    return float(correct) / count, float(loss_sum) / count
