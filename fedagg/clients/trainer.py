"""Local training: SGD on one client's data, with a per-round learning-rate schedule.

`conf/client/sgd.yaml` instantiates `LocalSGD`. The engine calls `train` once per
participating client and round; the trainer owns what persists on the client side
between rounds (optimizer state, when `keep_optimizer_state` is on, keyed by client id).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector

from fedagg.clients.objectives import Objective

SCHEDULES = ("constant", "exponential", "multistep")


@dataclass
class ClientData:
    """One client's share of the training pool, as index tensors on the data's device."""

    id: int
    train_idx: Tensor
    val_idx: Tensor

    @property
    def num_samples(self) -> int:
        return int(self.train_idx.numel())


def _check(condition: bool, key: str, value, allowed: str) -> None:
    if not condition:
        raise ValueError(f"client.{key}={value!r} is not allowed; {allowed}")


class LocalSGD:
    def __init__(
        self,
        lr: float = 0.05,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        local_epochs: int = 1,
        batch_size: int = 32,
        schedule: str = "constant",
        decay: float = 1.0,
        milestones: tuple[float, ...] = (0.5, 0.75),
        gamma: float = 0.1,
        keep_optimizer_state: bool = False,
        val_frac: float | None = None,
        objective: Objective | None = None,
    ) -> None:
        _check(lr > 0, "lr", lr, "it must be > 0")
        _check(0 <= momentum < 1, "momentum", momentum, "it must be in [0, 1)")
        _check(not nesterov or momentum > 0, "nesterov", nesterov, "Nesterov needs client.momentum > 0")
        _check(weight_decay >= 0, "weight_decay", weight_decay, "it must be >= 0")
        _check(int(local_epochs) == local_epochs and local_epochs >= 1, "local_epochs", local_epochs, "it must be an integer >= 1")
        _check(int(batch_size) == batch_size and batch_size >= 1, "batch_size", batch_size, "it must be an integer >= 1")
        _check(schedule in SCHEDULES, "schedule", schedule, f"choose one of {', '.join(SCHEDULES)}")
        _check(0 < decay <= 1, "decay", decay, "it must be in (0, 1], the per-round factor such as 0.99")
        _check(all(0 < m < 1 for m in milestones), "milestones", list(milestones), "each must be a fraction of the rounds in (0, 1)")
        _check(0 < gamma <= 1, "gamma", gamma, "it must be in (0, 1]")
        _check(val_frac is None or 0 <= val_frac < 1, "val_frac", val_frac, "it must be in [0, 1), or null")
        self.lr, self.momentum, self.nesterov, self.weight_decay = lr, momentum, nesterov, weight_decay
        self.local_epochs, self.batch_size = int(local_epochs), int(batch_size)
        self.schedule, self.decay, self.milestones, self.gamma = schedule, decay, tuple(sorted(milestones)), gamma
        self.keep_optimizer_state = keep_optimizer_state
        self.val_frac = val_frac
        self.objective = objective if objective is not None else Objective()
        self.optimizer_states: dict[int, dict] = {}

    def state_dict(self) -> dict:
        """What clients carry between rounds: optimizer state (when kept) and the objective's state."""
        return {"optimizer_states": copy.deepcopy(self.optimizer_states), "objective": self.objective.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer_states = {int(k): v for k, v in state["optimizer_states"].items()}
        self.objective.load_state_dict(state["objective"])

    def lr_at(self, round: int, total_rounds: int) -> float:
        """Learning rate of 1-based `round`."""
        if self.schedule == "exponential":
            return self.lr * self.decay ** (round - 1)
        if self.schedule == "multistep":
            passed = sum(1 for m in self.milestones if round > m * total_rounds)
            return self.lr * self.gamma**passed
        return self.lr

    def make_optimizer(self, model: nn.Module, client_id: int, lr: float) -> torch.optim.Optimizer:
        opt = torch.optim.SGD(
            model.parameters(), lr=lr, momentum=self.momentum, nesterov=self.nesterov, weight_decay=self.weight_decay
        )
        saved = self.optimizer_states.get(client_id)
        if saved is not None:
            opt.load_state_dict(saved)
            for group in opt.param_groups:  # the schedule, not the saved state, sets this round's lr
                group["lr"] = lr
        return opt

    def train(self, model: nn.Module, client: ClientData, data, *, lr: float, generator: torch.Generator) -> float:
        """Local epochs of minibatch SGD from the model's current weights; returns the mean loss."""
        opt = self.make_optimizer(model, client.id, lr)
        model.train()
        params = list(model.parameters())
        start = parameters_to_vector(params).detach()
        anchor = [p.detach().clone() for p in params]
        state = self.objective.client_state(client.id, start)
        state = None if state is None else [s.view_as(p) for s, p in zip(state.split([p.numel() for p in params]), params)]
        n = client.num_samples
        loss_sum = torch.zeros((), device=client.train_idx.device)
        for _ in range(self.local_epochs):
            order = client.train_idx[torch.randperm(n, generator=generator, device=client.train_idx.device)]
            for batch in order.split(self.batch_size):
                x, y = data.train_batch(batch, generator)
                task_loss = F.cross_entropy(model(x), y)
                extra = self.objective.penalty(params, anchor, state)
                opt.zero_grad(set_to_none=True)
                (task_loss if extra is None else task_loss + extra).backward()
                opt.step()
                loss_sum += task_loss.detach() * batch.numel()  # the task loss, comparable across objectives
        if self.keep_optimizer_state:
            self.optimizer_states[client.id] = copy.deepcopy(opt.state_dict())
        self.objective.after_training(client.id, parameters_to_vector(params).detach(), start)
        return float(loss_sum) / (n * self.local_epochs)
