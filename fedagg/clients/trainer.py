"""Local training: minibatch SGD on each client's data, with a per-round learning-rate schedule.

`conf/client/sgd.yaml` instantiates `LocalSGD`. It is the one definition of local
training that every engine executes (DESIGN principle 5): which batches a client sees and
in what order (`plan`), what it minimises (`loss`: the task loss plus its objective's
term), and how a step moves its weights (`optimizer`: torch.optim.SGD's arithmetic on
stacked clients). An engine only decides how the forward pass runs, one client's model at
a time or a round's clients stacked. The trainer also owns what persists on the client
side between rounds (optimizer state when `keep_optimizer_state` is on, and the
objective's state), keyed by client id in `ClientStore`s, which keep host memory and
checkpoints bounded however many clients there are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedagg.clients.batches import BatchPlan, num_steps
from fedagg.clients.client import ClientData
from fedagg.clients.objectives import LocalWork, Objective
from fedagg.clients.stacked_sgd import StackedSGD
from fedagg.clients.store import ClientStore
from fedagg.config.constraints import Items, Range, Tune, checked, typed
from fedagg.models.flat import unflatten

Count = Annotated[int, Range(ge=1, integer=True, words="it must be an integer >= 1")]
Fraction = Annotated[float, Range(ge=0, lt=1, words="it must be in [0, 1), or null")]


@dataclass(frozen=True)
class LocalSolver:
    """How clients take their local steps, for a server rule that depends on it (FedNova's a_k)."""

    momentum: float
    nesterov: bool
    weight_decay: float
    proximal_mu: float  # of the client objective; 0 without a proximal term
    keeps_momentum: bool  # momentum buffers carried from round to round (keep_optimizer_state)


def _check(condition: bool, key: str, value, allowed: str) -> None:
    if not condition:
        raise ValueError(f"client.{key}={typed(value)} is not allowed; {allowed}")


class LocalSGD:
    @checked("client.")
    def __init__(
        self,
        # one range for every method in a fair comparison (python -m fedagg.compare)
        lr: Annotated[float, Range(gt=0, words="it must be > 0"),
                      Tune(1e-3, 10**0.5, log=True, source="Reddi et al. 2021 (App. D): client rate grid 10^-3 .. 10^0.5")] = 0.05,
        momentum: Annotated[float, Range(ge=0, lt=1, words="it must be in [0, 1)")] = 0.0,
        nesterov: bool = False,
        weight_decay: Annotated[float, Range(ge=0, words="it must be >= 0")] = 0.0,
        local_epochs: Count = 1,
        batch_size: Count = 32,
        schedule: Literal["constant", "exponential", "multistep"] = "constant",
        decay: Annotated[float, Range(gt=0, le=1, words="it must be in (0, 1], the per-round factor such as 0.99")] = 1.0,
        milestones: Annotated[tuple[float, ...], Items(Range(gt=0, lt=1),
                                                       words="each must be a fraction of the rounds in (0, 1)")] = (0.5, 0.75),
        gamma: Annotated[float, Range(gt=0, le=1, words="it must be in (0, 1]")] = 0.1,
        keep_optimizer_state: bool = False,
        val_frac: Fraction | None = None,
        test_frac: Fraction | None = None,
        objective: Objective | None = None,
    ) -> None:
        _check(not nesterov or momentum > 0, "nesterov", nesterov, "Nesterov needs client.momentum > 0")
        self.lr, self.momentum, self.nesterov, self.weight_decay = lr, momentum, nesterov, weight_decay
        self.local_epochs, self.batch_size = int(local_epochs), int(batch_size)
        self.schedule, self.decay, self.milestones, self.gamma = schedule, decay, tuple(sorted(milestones)), gamma
        self.keep_optimizer_state = keep_optimizer_state
        self.val_frac, self.test_frac = val_frac, test_frac
        self.objective = objective if objective is not None else Objective()
        self.optimizer_states = ClientStore()  # client id -> flat momentum [P] (keep_optimizer_state)

    def client_stores(self) -> dict[str, ClientStore]:
        """Every per-client store of the client side, by a folder name: the run loop gives each a folder."""
        return {"momentum": self.optimizer_states, **self.objective.client_stores()}

    def state_dict(self) -> dict:
        """What clients carry between rounds: optimizer state (when kept) and the objective's state."""
        return {"optimizer_states": self.optimizer_states.state_dict(), "objective": self.objective.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer_states.load_state_dict(_flat_momentum(state["optimizer_states"]))
        self.objective.load_state_dict(state["objective"])

    def lr_at(self, round: int, total_rounds: int) -> float:
        """Learning rate of 1-based `round`."""
        if self.schedule == "exponential":
            return self.lr * self.decay ** (round - 1)
        if self.schedule == "multistep":
            passed = sum(1 for m in self.milestones if round > m * total_rounds)
            return self.lr * self.gamma**passed
        return self.lr

    def solver(self) -> LocalSolver:
        return LocalSolver(self.momentum, self.nesterov, self.weight_decay, self.objective.proximal_mu,
                           self.keep_optimizer_state and self.momentum > 0)

    # -- the definition of local training, executed by every engine ----------------------
    @property
    def stackable(self) -> bool:
        """Whether the loss can run under torch.func.vmap over stacked clients (engine=parallel)."""
        return self.objective.stackable

    def steps(self, client: ClientData, budget: int | None = None) -> int:
        """Optimizer steps `client` takes in a round: its local epochs, or fewer when its budget says so."""
        full = num_steps(client.num_samples, self.batch_size, self.local_epochs)
        return full if budget is None else min(full, budget)

    def plan(self, clients: list[ClientData], data, *, seed: int, round: int,
             budgets: list[int] | None = None) -> BatchPlan:
        """Every batch of these clients' round, drawn from each client's own stream (most steps first);
        a client with a budget takes the first `budget` batches of its plan."""
        return BatchPlan(clients, data, batch_size=self.batch_size, epochs=self.local_epochs, seed=seed, round=round,
                         budgets=budgets)

    def loss(self, logits: Tensor, y: Tensor, params: list[Tensor], anchor: list[Tensor],
             state: list[Tensor] | None) -> tuple[Tensor, Tensor]:
        """(what one client's step minimises on its batch, the task loss alone); `anchor` is the global model."""
        # one prediction per sample ([B, C] against [B]) or per position ([B, T, C] against [B, T]), all averaged
        task = F.cross_entropy(logits.float().flatten(0, -2), y.flatten())
        extra = self.objective.penalty(params, anchor, state)
        return (task if extra is None else task + extra), task.detach()

    def stacked_task_losses(self, logits: Tensor, y: Tensor, real: Tensor | None = None) -> Tensor:
        """`loss`'s task term for g clients at once, [g]: logits [g, n, (T,) C] against labels [g, n, (T,)]. With
        `real` [g], only the first real[k] samples of client k's batch count (the rest fill it up to n)."""
        g, n = y.shape[:2]
        per = F.cross_entropy(logits.float().flatten(0, -2), y.flatten(), reduction="none").view(g, n, -1)
        if real is None:
            return per.flatten(1).mean(1)
        keep = torch.arange(n, device=y.device).view(1, n, 1) < real.view(g, 1, 1)
        return torch.where(keep, per, 0).flatten(1).sum(1) / (real * per.shape[2])

    def penalty(self, params: list[Tensor], anchor: list[Tensor], state: list[Tensor] | None) -> Tensor:
        """`loss`'s objective term for one client (0 without one)."""
        extra = self.objective.penalty(params, anchor, state)
        return params[0].new_zeros(()) if extra is None else extra

    def objective_state(self, clients: list[ClientData], global_params: Tensor,
                        shapes: list[torch.Size]) -> list[Tensor] | None:
        """The objective's per-client state as one [k, ...] tensor per parameter (None when it keeps none)."""
        states = [self.objective.client_state(c.id, global_params) for c in clients]
        if states[0] is None:
            return None
        return unflatten(torch.stack(states), shapes)

    def optimizer(self, params: list[Tensor], clients: list[ClientData], lr: float) -> StackedSGD:
        """SGD on stacked [k, ...] parameters, continuing each client's kept state when asked to."""
        saved = [self.optimizer_states.get(c.id) if self.keep_optimizer_state else None for c in clients]
        return StackedSGD(params, lr=lr, momentum=self.momentum, nesterov=self.nesterov,
                          weight_decay=self.weight_decay, saved=saved)

    def finish(self, plan: BatchPlan, clients: list[ClientData], trained: Tensor, global_params: Tensor,
               sgd: StackedSGD, template: nn.Module, lr: float) -> list[dict[str, Tensor] | None]:
        """After local training: keep optimizer and objective state; what each client sends the server."""
        momentum = sgd.flat_buffers() if self.keep_optimizer_state else None
        if momentum is not None:
            momentum = momentum.cpu()  # one transfer for the round's clients; the store keeps them on the host
            for c, row in zip(clients, momentum):
                self.optimizer_states.put(c.id, row)
        return [self.objective.after_training(c.id, row, global_params, LocalWork(steps, lr))
                for c, row, steps in zip(clients, trained, plan.steps)]

    @staticmethod
    def mean_loss(loss_sums: Tensor, plan: BatchPlan) -> Tensor:
        """[k] mean task loss per training sample seen, from each client's sum of batch loss x batch size."""
        seen = torch.tensor(plan.seen, dtype=torch.float64, device=loss_sums.device)
        return (loss_sums.double() / seen).float()


def _flat_momentum(state: dict) -> dict:
    """A checkpoint from before the store kept torch.optim.SGD state_dicts per client id: their flat momentum."""
    if "inline" in state:
        return state
    return {cid: torch.cat([e["momentum_buffer"].reshape(-1) for _, e in sorted(sgd["state"].items())])
            for cid, sgd in state.items() if sgd["state"]}
