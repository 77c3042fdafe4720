"""Accuracy and mean loss of a model over batches, and its accuracy on every client's local test split."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedagg.data.device import local_test
from fedagg.models.base import at_least_float32


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[tuple[Tensor, Tensor]]) -> tuple[float, float]:
    """(accuracy in 0-1, mean cross-entropy); (0.0, nan) for no data."""
    model.eval()
    correct = torch.zeros((), dtype=torch.long)
    loss_sum = torch.zeros(())
    count = 0
    for x, y in batches:
        logits = model(x)  # [B, C], or [B, T, C] for a sequence scored at every position
        correct = correct.to(y.device) + (logits.argmax(-1) == y).sum()
        loss_sum = loss_sum.to(y.device) + F.cross_entropy(at_least_float32(logits).flatten(0, -2), y.flatten(), reduction="sum")
        count += y.numel()
    if count == 0:
        return 0.0, float("nan")
    return float(correct) / count, float(loss_sum) / count


@torch.no_grad()
def per_client_accuracy(model: nn.Module, data, test_idx: list[Tensor], batch_size: int) -> Tensor:
    """[N] accuracy of `model` on each client's local test split, in batches of `batch_size` across clients."""
    idx = torch.cat(test_idx)
    sizes = torch.tensor([t.numel() for t in test_idx], device=idx.device)
    owner = torch.repeat_interleave(torch.arange(len(test_idx), device=idx.device), sizes)
    correct = torch.zeros(len(test_idx), device=idx.device)
    model.eval()
    for start in range(0, idx.numel(), batch_size):
        part = idx[start:start + batch_size]
        x, y = local_test(data, part)  # a client's local test samples as it sees them (with partition.noise)
        right = (model(x).argmax(-1) == y).float().view(part.numel(), -1).mean(1)  # a sequence: its positions' share
        correct.index_add_(0, owner[start:start + batch_size], right)
    return correct / sizes.clamp(min=1)


def spread(acc: Tensor) -> dict[str, float]:
    """What metrics.csv keeps of the per-client accuracies: mean, (population) std, 10th percentile, minimum."""
    acc = acc.double()
    return {"client_acc_mean": float(acc.mean()), "client_acc_std": float(acc.std(correction=0)),
            "client_acc_p10": float(torch.quantile(acc, 0.1)), "client_acc_min": float(acc.min())}


@torch.no_grad()
def client_losses(model: nn.Module, data, train_idx: list[Tensor], batch_size: int, samples: int | None = None,
                  generator: torch.Generator | None = None) -> Tensor:
    """[M] float64: `model`'s mean cross-entropy (eval mode) on each of the training splits `train_idx`, or on
    `samples` of each drawn with `generator` (all of a split that has fewer). A sampler's scores of clients, not
    training: nothing is updated."""
    losses = []
    for idx in train_idx:
        if samples is not None and samples < idx.numel():
            idx = idx[torch.randperm(idx.numel(), generator=generator)[:samples].to(idx.device)]
        losses.append(evaluate(model, data.eval_batches(idx, batch_size, "train"))[1])
    return torch.tensor(losses, dtype=torch.float64)
