"""Local training: minibatch SGD on each client's data, with a per-round learning-rate schedule.

`conf/client/sgd.yaml` instantiates `LocalSGD`. It is the one definition of local
training that every engine executes (DESIGN principle 5): which batches a client sees and
in what order (`plan`), what it minimises (`forward_terms` and `loss`: the task loss plus
its objective's terms, fedagg/clients/forward.py), and how a step moves its weights
(`optimizer`: torch.optim.SGD's arithmetic on stacked clients; `tracker`: the parameters'
sensitivity when the aggregator needs it). An engine only decides how the forward pass
runs, one client's model at a time or a round's clients stacked. The trainer also owns what
persists on the client side between rounds (optimizer state when `keep_optimizer_state` is
on, the objective's state, each client's previous model when the objective sees it, its
sensitivity), keyed by client id in `ClientStore`s, which keep host memory and checkpoints
bounded however many clients there are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedagg.clients import forward as fwd
from fedagg.clients.batches import BatchPlan, num_steps
from fedagg.clients.client import ClientData
from fedagg.clients.objectives import LocalWork, Objective
from fedagg.clients.sensitivity import Sensitivity, StackedSensitivity
from fedagg.clients.stacked_sgd import StackedSGD
from fedagg.clients.store import ClientStore
from fedagg.config.constraints import Items, Range, Tune, checked, typed
from fedagg.models.base import at_least_float32

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
        weight_decay_on: Literal["all", "kernels"] = "all",
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
        self.weight_decay_on = weight_decay_on
        self.local_epochs, self.batch_size = int(local_epochs), int(batch_size)
        self.schedule, self.decay, self.milestones, self.gamma = schedule, decay, tuple(sorted(milestones)), gamma
        self.keep_optimizer_state = keep_optimizer_state
        self.val_frac, self.test_frac = val_frac, test_frac
        self.objective = objective if objective is not None else Objective()
        self.optimizer_states = ClientStore()  # client id -> flat momentum [P] (keep_optimizer_state)
        self.previous_models = ClientStore()  # client id -> its last trained parameters and buffers [P + B]
        self.sensitivity: Sensitivity | None = None  # set when the aggregator needs it (loop/assembly.py connect)
        # adapters of unequal client ranks (fedagg.models.adapters.masks.RankMasks); set by loop/assembly.py
        self.rank_masks = None
        self.sensitivities = ClientStore()  # client id -> its kept sensitivity [P] or [L]

    def client_stores(self) -> dict[str, ClientStore]:
        """Every per-client store of the client side, by a folder name: the run loop gives each a folder."""
        return {"momentum": self.optimizer_states, "previous_models": self.previous_models,
                "sensitivity": self.sensitivities, **self.objective.client_stores()}

    def state_dict(self) -> dict:
        """What clients carry between rounds: optimizer state (when kept), the objective's state, previous models
        and sensitivities (when asked for)."""
        return {"optimizer_states": self.optimizer_states.state_dict(), "objective": self.objective.state_dict(),
                "previous_models": self.previous_models.state_dict(), "sensitivities": self.sensitivities.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer_states.load_state_dict(_flat_momentum(state["optimizer_states"]))
        self.objective.load_state_dict(state["objective"])
        empty = {"inline": {}, "files": {}, "version": 0}  # a checkpoint from before these were kept
        self.previous_models.load_state_dict(state.get("previous_models", empty))
        self.sensitivities.load_state_dict(state.get("sensitivities", empty))

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

    def plan(self, clients: list[ClientData], data, *, seed: int, round: int | list[int],
             budgets: list[int] | None = None) -> BatchPlan:
        """Every batch of these clients' round, drawn from each client's own stream (most steps first);
        a client with a budget takes the first `budget` batches of its plan. `round`: the stream of every client,
        or of each (`RoundJob.draws`)."""
        return BatchPlan(clients, data, batch_size=self.batch_size, epochs=self.local_epochs, seed=seed, round=round,
                         budgets=budgets)

    def forward_terms(self, forward: fwd.Forward, params: list[Tensor], buffers: list[Tensor], x: Tensor,
                      y: Tensor, run: fwd.RunInputs, own: fwd.ClientInputs) -> fwd.Terms:
        """The local logits, those one client's task loss is taken of, and its objective's term (or None) on its
        batch; `forward` is the engine's way of running a model (fedagg/clients/forward.py)."""
        return fwd.forward_terms(self.objective, forward, params, buffers, x, y, run, own)

    def loss(self, logits: Tensor, y: Tensor, extra: Tensor | None) -> tuple[Tensor, Tensor]:
        """(what one client's step minimises on its batch, the task loss alone) from `forward_terms`' results."""
        # one prediction per sample ([B, C] against [B]) or per position ([B, T, C] against [B, T]), all averaged
        task = F.cross_entropy(at_least_float32(logits).flatten(0, -2), y.flatten())
        return (task if extra is None else task + extra), task.detach()

    def stacked_task_losses(self, logits: Tensor, y: Tensor, real: Tensor | None = None) -> Tensor:
        """`loss`'s task term for g clients at once, [g]: logits [g, n, (T,) C] against labels [g, n, (T,)]. With
        `real` [g], only the first real[k] samples of client k's batch count (the rest fill it up to n)."""
        g, n = y.shape[:2]
        per = F.cross_entropy(at_least_float32(logits).flatten(0, -2), y.flatten(), reduction="none").view(g, n, -1)
        if real is None:
            return per.flatten(1).mean(1)
        keep = torch.arange(n, device=y.device).view(1, n, 1) < real.view(g, 1, 1)
        return torch.where(keep, per, 0).flatten(1).sum(1) / (real * per.shape[2])

    def run_inputs(self, global_params: Tensor, global_buffers: Tensor, shapes: list[torch.Size],
                   templates: list[Tensor]) -> fwd.RunInputs:
        """What the round's clients share: the global model, per tensor (`templates`: the model's buffers)."""
        return fwd.run_inputs(self.objective, global_params, global_buffers, shapes, templates)

    def client_inputs(self, clients: list[ClientData], data, global_params: Tensor, global_buffers: Tensor,
                      shapes: list[torch.Size], templates: list[Tensor], complete: bool = False) -> fwd.ClientInputs:
        """Each client's own inputs to its loss (objective state, previous model, label counts), [k, ...]."""
        return fwd.client_inputs(self.objective, clients, data, global_params, global_buffers, shapes, templates,
                                     self.previous_models, complete)

    def starts(self, clients: list[ClientData], global_params: Tensor,
               global_buffers: Tensor) -> tuple[Tensor, Tensor] | None:
        """Where each client starts, [k, P] and [k, B], when its objective gives clients models of their own;
        None: every client starts from the global model."""
        if not self.objective.personal and self.rank_masks is None:
            return None
        starts = [self.objective.start(c.id, global_params, global_buffers) for c in clients]
        params, buffers = torch.stack([p for p, _ in starts]), torch.stack([b for _, b in starts])
        if self.rank_masks is not None:  # a client of rank r starts from the first r of the padded factors
            params = self.rank_masks.cut([c.id for c in clients], params)
        return params, buffers

    def tracker(self, params: list[Tensor], clients: list[ClientData]) -> StackedSensitivity | None:
        """The sensitivity of stacked [k, ...] parameters over the round, from each client's kept one (when the
        aggregator needs it). A step then differentiates `self.sensitivity.targets` too."""
        if self.sensitivity is None:
            return None
        return StackedSensitivity(self.sensitivity, params, [self.sensitivities.get(c.id) for c in clients])

    def optimizer(self, params: list[Tensor], clients: list[ClientData], lr: float,
                  model: nn.Module | None = None) -> StackedSGD:
        """SGD on stacked [k, ...] parameters (those of `model`, in its order), continuing each client's kept
        state when asked to."""
        saved = [self.optimizer_states.get(c.id) if self.keep_optimizer_state else None for c in clients]
        decays = None if self.weight_decay_on == "all" else kernel_flags(model)
        return StackedSGD(params, lr=lr, momentum=self.momentum, nesterov=self.nesterov,
                          weight_decay=self.weight_decay, saved=saved, decays=decays)

    def finish(self, plan: BatchPlan, clients: list[ClientData], trained: Tensor, buffers: Tensor,
               global_params: Tensor, sgd: StackedSGD, tracker: StackedSensitivity | None,
               lr: float) -> tuple[list[dict[str, Tensor] | None], Tensor | None]:
        """After local training (`trained` [k, P], `buffers` [k, B]): keep optimizer and objective state, previous
        models and sensitivities; (what each client sends the server, their sensitivities [k, ...] or None)."""
        momentum = sgd.flat_buffers() if self.keep_optimizer_state else None
        if momentum is not None:
            momentum = momentum.cpu()  # one transfer for the round's clients; the store keeps them on the host
            for c, row in zip(clients, momentum):
                self.optimizer_states.put(c.id, row)
        if self.objective.sees.previous_model:
            for c, row in zip(clients, torch.cat([trained, buffers.to(trained.dtype)], 1).cpu()):
                self.previous_models.put(c.id, row)
        sensitivity = None if tracker is None else tracker.flat()
        if sensitivity is not None:
            for c, row in zip(clients, sensitivity.cpu()):
                self.sensitivities.put(c.id, row)
        sent = [self.objective.after_training(c.id, row, global_params, LocalWork(steps, lr, kept))
                for c, row, steps, kept in zip(clients, trained, plan.steps, buffers)]
        return sent, sensitivity

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


KERNEL_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def kernel_flags(model: nn.Module | None) -> list[bool]:
    """Per parameter tensor of `model` (its parameters() order): whether it is the weight of a convolution or a
    linear layer, a kernel in Keras's words; norms' weights, biases and embeddings are not."""
    if model is None:
        raise ValueError("client.weight_decay_on=kernels needs the model to tell kernels from other parameters")
    kernels = {id(m.weight) for m in model.modules() if isinstance(m, KERNEL_LAYERS)}
    return [id(p) in kernels for p in model.parameters()]
