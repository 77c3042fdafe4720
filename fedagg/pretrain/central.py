"""A base trained centrally: every training sample of the chosen classes in one model, AdamW, shuffled
minibatches from the base's own seed, the dataset's own device pipeline (fedagg.data.device) and the
loss every fedagg run trains with (cross-entropy over classes, or over every position of a sequence).

Central, not federated: a base stands for what a public pretrained checkpoint is to the papers that
fine-tune one federatedly, so it is trained the way such checkpoints are, on data the federated
clients do not hold (another dataset, or other classes of the same one: `classes`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedagg.data.device import DeviceData
from fedagg.seeding import generator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pretraining:
    epochs: int = 1
    lr: float = 1e-3
    batch_size: int = 64
    weight_decay: float = 0.01
    classes: Sequence[int] | None = None  # the labels trained on (the rest are held out for the federation)
    max_samples: int | None = None  # a seeded subset of that many training samples (a quick base on the CPU)
    seed: int = 0


def chosen(labels: Tensor, classes: Sequence[int] | None) -> Tensor:
    """Indices of the samples whose label is one of `classes` (all when None)."""
    if classes is None:
        return torch.arange(len(labels), device=labels.device)
    wanted = torch.tensor(list(classes), device=labels.device)
    return torch.isin(labels, wanted).nonzero().flatten()


def accuracy(model: nn.Module, data: DeviceData, idx: Tensor, batch_size: int = 1024) -> float:
    """Share of correct predictions on test samples `idx` (every position of a sequence counts)."""
    was = model.training
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in data.eval_batches(idx, batch_size, split="test"):
            correct += int((model(x).argmax(-1) == y).sum())
            total += y.numel()
    model.train(was)
    return correct / max(total, 1)


def pretrain(model: nn.Module, data: DeviceData, plan: Pretraining, say=log.info) -> dict:
    """Train `model` in place on `data`'s training samples of `plan.classes`; returns what the base file records."""
    idx = chosen(data.train_y, plan.classes)
    g = generator(plan.seed, "pretrain", device=data.device)
    if plan.max_samples is not None and plan.max_samples < len(idx):
        idx = idx[torch.randperm(len(idx), generator=g, device=data.device)[: plan.max_samples]].sort().values
    test_idx = chosen(data.test_y, plan.classes)
    opt = torch.optim.AdamW(model.parameters(), lr=plan.lr, weight_decay=plan.weight_decay)
    model.train()
    loss = torch.zeros(())
    for epoch in range(1, plan.epochs + 1):
        total, steps = 0.0, 0
        for batch in idx[torch.randperm(len(idx), generator=g, device=data.device)].split(plan.batch_size):
            x, y = data.train_batch(batch, g)
            logits = model(x)
            loss = F.cross_entropy(logits.float().flatten(0, -2), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total, steps = total + loss.item(), steps + 1
        say(f"epoch {epoch}/{plan.epochs}: train loss {total / max(steps, 1):.4f}, "
            f"test accuracy {accuracy(model, data, test_idx):.4f}")
    return {"samples": len(idx), "epochs": plan.epochs, "lr": plan.lr, "batch_size": plan.batch_size,
            "classes": None if plan.classes is None else list(plan.classes), "seed": plan.seed,
            "test_acc": accuracy(model, data, test_idx), "test_samples": len(test_idx)}
