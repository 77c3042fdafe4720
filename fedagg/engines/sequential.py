"""Engines train a round's clients and return their parameters as one [K, P] tensor.

`SequentialEngine` trains clients one after another in a single working model; it is
the reference that faster engines must match.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fedagg.clients.trainer import ClientData, LocalSGD
from fedagg.loop.evaluation import evaluate
from fedagg.models.flat import get_buffers, get_params, set_buffers, set_params
from fedagg.data.seeding import generator


@dataclass
class RoundResult:
    params: Tensor  # [K, P] trainable parameters after local training
    buffers: Tensor  # [K, B] buffers (BatchNorm statistics) after local training
    train_loss: Tensor  # [K] mean local training loss
    val_acc: Tensor | None  # [K] accuracy of each trained client model on its validation indices, when asked


class SequentialEngine:
    def __init__(self, eval_batch_size: int = 1024) -> None:
        if eval_batch_size < 1:
            raise ValueError(f"engine.eval_batch_size={eval_batch_size!r} is not allowed; it must be >= 1")
        self.eval_batch_size = int(eval_batch_size)

    def train_round(
        self,
        model: nn.Module,
        global_params: Tensor,
        global_buffers: Tensor,
        clients: list[ClientData],
        trainer: LocalSGD,
        data,
        *,
        lr: float,
        seed: int,
        round: int,
        val_indices: list[Tensor] | None = None,
    ) -> RoundResult:
        """Train `clients` from the global weights; score each on `val_indices[k]` when given."""
        params, buffers, losses, accs = [], [], [], []
        for k, client in enumerate(clients):
            set_params(model, global_params)
            set_buffers(model, global_buffers)
            g = generator(seed, "batches", client.id, round, device=data.device)
            losses.append(trainer.train(model, client, data, lr=lr, generator=g))
            params.append(get_params(model))
            buffers.append(get_buffers(model))
            if val_indices is not None:
                accs.append(evaluate(model, data.eval_batches(val_indices[k], self.eval_batch_size, split="train"))[0])
        device = global_params.device
        return RoundResult(
            params=torch.stack(params),
            buffers=torch.stack(buffers),
            train_loss=torch.tensor(losses, device=device),
            val_acc=torch.tensor(accs, device=device) if val_indices is not None else None,
        )
