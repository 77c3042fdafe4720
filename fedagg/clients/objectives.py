"""Client objectives: what local training minimises besides the task loss.

An objective adds a term to the local loss and may keep per-client state across rounds.
It is written over lists of parameter tensors (`penalty`) and over one client's batch as the
forward pass saw it (`forward_term`, `task_logits`), so the sequential engine calls it on a
model's parameters and outputs and the parallel engine vmaps it over stacked clients. What it
reads of the forward pass it declares in `sees` (`Sees`: the local representation, the round's
global model and the client's previous model, both frozen, the client's label counts), and
both engines supply exactly that (`Seen`). Client-only methods are chosen with
`client/objective=...` (FedProx, MOON, ...); a method with a server half too (FedDyn,
SCAFFOLD) brings its objective in its aggregator YAML as its client half, which may also send
the server a payload per client (e.g. a control-variate delta). A function the CPU rounds by where an
element sits (softplus, log1p, sigmoid, a fractional power) goes through `elementwise`, so that a client's
loss does not depend on the clients stacked beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, NamedTuple

import torch.nn.functional as F
from torch import Tensor

from fedagg.clients.store import ClientStore
from fedagg.config.constraints import Range, Tune, checked
from fedagg.config.names import Named
from fedagg.models.base import Representation


def squared_distance(params: list[Tensor], anchor: list[Tensor]) -> Tensor:
    return sum(((p - a) ** 2).sum() for p, a in zip(params, anchor))


# Elements of a whole number of the steps torch's vectorised CPU kernels take: two registers of floats, 32 with
# AVX-512, 128 with SVE's longest.
LANES = 128


def elementwise(fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """`fn(x)` for an elementwise `fn` (softplus, log1p, sigmoid, pow with a fractional exponent), its value at an
    element independent of the elements around it in memory.

    The CPU kernels of such functions compute a tensor's elements in vector registers, but the last few, which
    fill no register, with scalar code that rounds differently in the last bit. Under the parallel engine a
    client's elements sit in one tensor with those of the clients beside it in the call, so where that tail falls
    depends on its neighbours: a stacked run would not equal the run alone. Padded to whole vectors per client,
    every element is computed by the vector code (the padding is thrown away; its gradient is zero)."""
    flat = x.reshape(-1)
    padded = F.pad(flat, (0, -flat.numel() % LANES))
    return fn(padded)[:flat.numel()].view(x.shape)


@dataclass(frozen=True)
class LocalWork:
    """What one client did in a round, for a client half whose state depends on it."""

    steps: int  # local optimizer steps taken
    lr: float  # the learning rate of this round
    buffers: Tensor | None = None  # its flat buffers [B] after training (BatchNorm statistics)


@dataclass(frozen=True)
class Sees:
    """What an objective reads of local training's forward pass; the engines supply exactly this, in `Seen`.
    Frozen models run in eval mode without gradients, on the client's batch."""

    representation: bool = False  # the local model's representation h(x) (Backbone.represent), beside its logits
    global_model: bool = False  # the round's global model
    previous_model: bool = False  # the client's previous local model (its last trained one, kept per client id)
    label_counts: bool = False  # the client's training samples per class [C]
    projection_head: int = 0  # > 0: the representation is taken after a projection head of this width (MOON's),
    # which the run puts under the backbone's classifier (Backbone.add_projection_head)

    @property
    def forward(self) -> bool:
        """Whether it declares reading the forward pass (the engines ask `Objective.reads_forward`, which adds
        what the objective overrides)."""
        return self.representation or self.global_model or self.previous_model or self.label_counts


class Seen(NamedTuple):
    """One client's batch as its objective sees it (what `Sees` declared; the rest None)."""

    y: Tensor  # labels [B] (a sequence model: [B, T])
    local: Representation  # the model being trained; `features` None unless Sees.representation
    global_model: Representation | None = None
    previous: Representation | None = None  # stands in with the global model for a client without one ...
    has_previous: Tensor | None = None  # ... which this 0-d bool says; None when every client has one
    label_counts: Tensor | None = None  # [C] float


# the hooks by which an objective changes local training; overriding one is what makes it contribute
LOSS_HOOKS = ("penalty", "forward_term", "task_logits")
HOOKS = (*LOSS_HOOKS, "start", "client_state", "after_training")


class Objective(metaclass=Named):
    """Plain empirical risk: nothing added, nothing kept (`client/objective=none`).

    What a subclass contributes is derived once, when the class is defined, from the hooks it overrides
    (`overrides`, `adds_to_loss`, `on_forward`, `personal`), never from a flag its author could forget: a
    `task_logits` of its own is always trained with, and always refused beside a method's own client half."""

    display_name: str | None = None  # `display_name: ...` in the method's YAML (see fedagg.config.names)
    stackable = True  # its penalty runs under torch.func.vmap on stacked clients (engine=parallel)
    proximal_mu = 0.0  # mu of a mu/2 ||theta - w||^2 term it adds, for server rules that depend on it (FedNova)
    sees = Sees()  # what it reads of the forward pass
    # derived by __init_subclass__ (a value set in a subclass's body is replaced):
    overrides: frozenset[str] = frozenset()  # the HOOKS its class defines anew
    adds_to_loss = False  # a term of the local loss (penalty, forward_term) or the task's logits (task_logits)
    on_forward = False  # forward_term or task_logits: the engines run the forward pass for it, whatever `sees` says
    personal = False  # start: each client starts from (and is evaluated with) a model of its own

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.overrides = frozenset(hook for hook in HOOKS if getattr(cls, hook) is not getattr(Objective, hook))
        cls.adds_to_loss = not cls.overrides.isdisjoint(LOSS_HOOKS)
        cls.on_forward = not cls.overrides.isdisjoint(("forward_term", "task_logits"))
        cls.personal = "start" in cls.overrides

    @property
    def reads_forward(self) -> bool:
        """Whether local training runs its forward pass through `Seen` (else the engines run it as plain logits)."""
        return self.on_forward or self.sees.forward

    def penalty(self, params: list[Tensor], anchor: list[Tensor], state: list[Tensor] | None) -> Tensor | None:
        """Term added to the batch loss; `anchor` is the round's global model, `state` this client's."""
        return None

    def forward_term(self, seen: Seen) -> Tensor | None:
        """Term added to the batch loss from the forward pass (`sees` says what `seen` holds)."""
        return None

    def task_logits(self, seen: Seen) -> Tensor:
        """The logits the task's cross-entropy is taken of (FedLC calibrates them)."""
        return seen.local.logits

    def start(self, client_id: int, params: Tensor, buffers: Tensor) -> tuple[Tensor, Tensor]:
        """The flat parameters [P] and buffers [B] this client starts from and is evaluated with, given the global
        ones (`personal` objectives only: FedBN's local normalisation layers)."""
        return params, buffers

    def setup(self, model) -> None:
        """Refuse, before any training, a model it cannot work with (one line naming the key); learn its layout."""

    def client_state(self, client_id: int, like: Tensor) -> Tensor | None:
        """This client's flat state [P] that `penalty` reads (None for stateless objectives)."""
        return None

    def after_training(self, client_id: int, trained: Tensor, global_params: Tensor,
                       work: LocalWork) -> dict[str, Tensor] | None:
        """Update this client's state from its trained flat parameters; return what it sends the
        server besides its model (each value becomes a row of `RoundInputs.payloads[key]`)."""
        return None

    def client_stores(self) -> dict[str, ClientStore]:
        """Its per-client state, by a folder name (`fedagg.clients.store`): bounded in memory and checkpoints."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class FedProx(Objective):
    """FedProx (Li et al. 2020): task loss + mu/2 ||theta - w||^2; the server is plain FedAvg."""

    @checked("client.objective.")
    def __init__(self, mu: Annotated[float, Range(ge=0, words="it must be >= 0"),
                                 Tune(1e-3, 1.0, log=True, source="Li et al. 2020: mu grid 0.001, 0.01, 0.1, 1")] = 0.01) -> None:
        self.mu = self.proximal_mu = mu

    def penalty(self, params, anchor, state):
        return 0.5 * self.mu * squared_distance(params, anchor)


def moved_to_aggregator(method: str) -> Objective:
    """An objective that became a method's client half: say where it lives now."""
    raise ValueError(f"client/objective={method} is not a choice of its own any more: {method} is one method with "
                     f"both halves; use aggregator={method} (and leave client/objective=none)")
