"""What every engine is given for a round (`RoundJob`) and what it returns (`RoundResult`).

An engine executes the local training that `fedagg.clients.trainer.LocalSGD` defines
(batch plan, loss, optimizer arithmetic) for a round's clients from the global weights; it
decides only how the forward passes run. `SequentialEngine` is the reference that other
engines must match.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

import torch
from torch import Tensor, nn

from fedagg.clients.client import ClientData
from fedagg.clients.trainer import LocalSGD
from fedagg.config.constraints import Range, checked

if TYPE_CHECKING:
    from fedagg.engines.choice import Picked, RoundShape


@dataclass(frozen=True)
class RoundJob:
    """One round of local training."""

    model: nn.Module  # the working model: its structure, and a place to load weights into
    trainer: LocalSGD
    data: object  # fedagg.data.device.DeviceData
    clients: list[ClientData]
    global_params: Tensor  # [P]
    global_buffers: Tensor  # [B]
    lr: float
    seed: int
    round: int
    val_indices: list[Tensor] | None = None  # where to score each trained client model, when asked
    budgets: list[int] | None = None  # most local steps each client may take (stragglers); None: all of them
    # each client's batch stream (seed, "batches", id, draw): its n-th local training on an asynchronous server,
    # where one client may train twice from one server version; None: every client's is the round's
    draws: list[int] | None = None

    def budget(self, k: int) -> int | None:
        return None if self.budgets is None else self.budgets[k]

    def draw(self, k: int) -> int:
        """Which of client k's batch streams it trains on: the round, or its own count (`draws`)."""
        return self.round if self.draws is None else self.draws[k]

    def steps(self) -> list[int]:
        """The local steps each client takes."""
        return [self.trainer.steps(c, self.budget(k)) for k, c in enumerate(self.clients)]


@dataclass
class RoundResult:
    params: Tensor  # [K, P] trainable parameters after local training
    buffers: Tensor  # [K, B] buffers (BatchNorm statistics) after local training
    train_loss: Tensor  # [K] mean local training loss
    val_acc: Tensor | None  # [K] accuracy of each trained client model on its validation indices, when asked
    local_steps: Tensor  # [K] long, optimizer steps each client took
    payloads: dict[str, Tensor] = field(default_factory=dict)  # [K, ...] per key, from the objective
    sensitivity: Tensor | None = None  # [K, P] or [K, L] each client's kept sensitivity, when the aggregator needs it


class Engine:
    """Shared options; a subclass implements `train_round`."""

    @checked("engine.")
    def __init__(self, eval_batch_size: Annotated[int, Range(ge=1, integer=True)] = 1024) -> None:
        self.eval_batch_size = eval_batch_size

    def check(self, trainer: LocalSGD) -> None:
        """Refuse, before any training, local training this engine cannot run as defined."""

    @property
    def clients_in_memory(self) -> int:
        """How many clients' models training holds at once; the aggregator's round-wide temporaries
        are cut to the same size (`RoundInputs.block_rows`)."""
        return 1

    def for_run(self, shape: "RoundShape") -> tuple["Engine", "Picked | None"]:
        """The engine that trains a run of this shape, and how it was picked: itself, picked by the user (None);
        engine=auto picks one (fedagg.engines.auto)."""
        return self, None

    def train_round(self, job: RoundJob) -> RoundResult:
        raise NotImplementedError

    def train_rounds(self, jobs: list[RoundJob]) -> list[RoundResult]:
        """Several jobs (each its own start model, learning rate and clients): one at a time here; the parallel
        engine trains them in one computation. Each result is what `train_round` gives its job alone."""
        return [self.train_round(job) for job in jobs]


def stack_payloads(payloads: list[dict[str, Tensor] | None]) -> dict[str, Tensor]:
    """Per-client payload dicts (in the round's client order) -> one [K, ...] tensor per key."""
    if not payloads or payloads[0] is None:
        return {}
    return {key: torch.stack([p[key] for p in payloads]) for key in payloads[0]}


def local_steps(job: RoundJob) -> Tensor:
    return torch.tensor(job.steps(), device=job.global_params.device)
