"""What a round hands its aggregator (`RoundInputs`) and what a method declares it needs (`Needs`).

The contract is the participants' updates: `inputs.updates` [K, P] holds each client's
update Δ_k = W_k − s_k against the model s_k it started from (`start_params`: the global
model in a synchronous round, [P]; one start per client, [K, P], where clients started at
different server versions). It is computed when first read and kept for the round, so a
rule that never reads it costs no second [K, P]; the block helpers of
`fedagg.aggregators.blocks` compute the same Δ a block at a time (`update_block`), so a
rule has one definition of Δ whichever it uses. `client_params` stays available for rules
defined on the models themselves (medians, Krum, layer-wise cosines).

Every aggregator gets the always-present fields. Anything more it declares once, in its
`needs`, and the round loop's one provider (`fedagg.loop.inputs`) fills exactly those
optional fields; nothing in the loop asks a method anything else. A field that was not
declared stays None, and `inputs.need(name)` says so in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Literal, get_args

import torch
from torch import Tensor, nn

from fedagg.models.flat import ParamLayout

if TYPE_CHECKING:
    from fedagg.clients.objectives import Objective
    from fedagg.clients.sensitivity import Sensitivity
    from fedagg.clients.trainer import LocalSolver

ValSource = Literal["local", "server"]
VAL_SOURCES = get_args(ValSource)


@dataclass(frozen=True)
class Needs:
    """An aggregator's declaration of what it needs beyond `RoundInputs`' always-present fields."""

    val_acc: str | None = None  # "local": each trained client model scored on its own held-out split; "server": on the server's
    label_hist: bool = False  # class counts of the participants [K, C] and of all clients' training data [C]
    server_samples: int = 0  # training samples the server holds out of every client (validation or proxy set)
    server_data: bool = False  # those samples and the model's structure, for a method that trains on them (FedLAW)
    local_steps: bool = False  # every participant's local steps [K], the round's local lr and the local solver
    buffers: bool = False  # the global model's buffers (BatchNorm statistics) [B] and the participants' [K, B]
    client_half: Objective | None = None  # the method's client side: a term of the local loss, per-client state, payloads
    sensitivity: Sensitivity | None = None  # each participant's parameter sensitivity, kept during local training
    adapters: bool = False  # a rule on low-rank adapters (adapter=lora): `layout.adapters` and the frozen base `base`
    frozen_a: bool = False  # the adapters' A stays at its seeded start, frozen with the base (FFA-LoRA)

    def __post_init__(self) -> None:
        if self.val_acc is not None and self.val_acc not in VAL_SOURCES:
            raise ValueError(f"aggregator.val_source={self.val_acc!r} is not allowed; choose one of {', '.join(VAL_SOURCES)}")
        if (self.val_acc == "server" or self.server_data) and self.server_samples < 1:
            raise ValueError("an aggregator that scores or trains on server data must hold out server_samples >= 1")

    @property
    def uses_extra_data(self) -> bool:
        """Results depend on data the server trains on: such runs are reported for reference only."""
        return self.server_data


@dataclass(frozen=True)
class Bits:
    """What one participant receives from the server (`down`) and sends back (`up`) in a round, in bits:
    the trainable parameters and the method's own payloads (SCAFFOLD's control variates), as the method
    sends them. The loop adds the BatchNorm buffers, which every method sends dense both ways."""

    down: int
    up: int
    # of `up`, what the method sends beside its model (SCAFFOLD's Δc_k): a channel that compresses the model
    # replaces the rest of `up` with its own count and leaves this as it is
    beside_model: int = 0


def dense(num_values: int) -> int:
    """Bits of `num_values` 32-bit floats."""
    return 32 * num_values


@dataclass(frozen=True)
class ClientSetup:
    """What a method may check before training: how clients train and how many take part in a round."""

    solver: LocalSolver
    num_clients: int
    clients_per_round: int  # the round's K when all sampled clients report


@dataclass(frozen=True)
class ServerData:
    """The server's own samples, and the global model to evaluate parameters on with `torch.func.functional_call`."""

    x: Tensor  # inputs, prepared for the model, on the device
    y: Tensor  # labels
    model: nn.Module  # structure only: pass parameters and `buffers` explicitly
    buffers: dict[str, Tensor]  # the global model's buffers this round (copies: BatchNorm may update them)


@dataclass(frozen=True)
class RoundInputs:
    """`fedagg.RoundInputs`: one round's participants, as flat vectors, and what the method declared it needs."""

    global_params: Tensor  # [P] trainable parameters before the round
    client_params: Tensor  # [K, P] after local training
    num_samples: Tensor  # [K] training samples per participant
    client_ids: Tensor  # [K] long, global ids
    round: int  # 1-based
    layout: ParamLayout  # where each parameter tensor ("layer") sits in P
    all_num_samples: Tensor  # [N] training samples of every client, by id
    seed: int = 0  # the run's seed, for a method that draws from its own stream generator(seed, name, round)
    val_acc: Tensor | None = None  # [K] Needs.val_acc
    label_hist: Tensor | None = None  # [K, C] Needs.label_hist
    global_label_hist: Tensor | None = None  # [C] Needs.label_hist
    server: ServerData | None = None  # Needs.server_data
    local_steps: Tensor | None = None  # [K] long, Needs.local_steps
    local_lr: float | None = None  # the clients' learning rate this round, Needs.local_steps
    local_solver: LocalSolver | None = None  # momentum, proximal term, ... of local SGD, Needs.local_steps
    global_buffers: Tensor | None = None  # [B] float, Needs.buffers
    client_buffers: Tensor | None = None  # [K, B] float, Needs.buffers
    payloads: dict[str, Tensor] = field(default_factory=dict)  # [K, ...] each, sent by Needs.client_half
    sensitivity: Tensor | None = None  # [K, P] (or [K, L] per tensor) Needs.sensitivity
    # a round-wide temporary may hold block_rows clients' worth of parameters (fedagg.aggregators.blocks); None: all K
    block_rows: int | None = None
    # the model(s) the clients started from: [P] (every client from one model) or [K, P]; None: global_params
    start_params: Tensor | None = None
    # [K] long: server steps taken since each update's start model (an asynchronous server's arrivals); None: a
    # synchronous round, where every update is against global_params
    staleness: Tensor | None = None
    # the upload channel's server side (DP's noise, a compressor's decoding): what the weighted mean update
    # sum_k p_k Delta_k becomes before the server step (the base `Aggregator.aggregate` applies it); None: as it is
    on_mean: Callable[[Tensor], Tensor] | None = None
    base: Tensor | None = None  # [Q] the frozen base under the adapters (adapter=lora), Needs.frozen_a

    def __post_init__(self) -> None:
        if self.start_params is None:
            object.__setattr__(self, "start_params", self.global_params)

    @property
    def num_clients(self) -> int:
        return self.client_params.shape[0]

    @cached_property
    def updates(self) -> Tensor:
        """[K, P] Δ_k = W_k − s_k, each client's update against the model it started from (computed once)."""
        return self.update_block()

    def update_block(self, rows: slice = slice(None), cols: slice = slice(None)) -> Tensor:
        """Δ for these rows and columns, a fresh contiguous tensor: client_params[rows, cols] − start (the one
        definition of an update; `updates` is the whole of it)."""
        start = self.start_params
        return self.client_params[rows, cols] - (start[cols] if start.dim() == 1 else start[rows, cols])

    def arrived_mean(self, mean_update: Tensor) -> Tensor:
        """The weighted mean update after the channel's server side (`on_mean`): what the server step applies."""
        return mean_update if self.on_mean is None else self.on_mean(mean_update)

    def need(self, name: str):
        """The optional field `name`, or a clear error when the method forgot to declare it."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"this aggregator reads inputs.{name} but does not declare it in its needs "
                             f"(fedagg.aggregators.inputs.Needs)")
        return value

    @classmethod
    def of(cls, global_params: Tensor, client_params: Tensor, *, num_samples: Tensor | None = None,
           client_ids: Tensor | None = None, round: int = 1, layout: ParamLayout | None = None,
           all_num_samples: Tensor | None = None, **optional) -> "RoundInputs":
        """Inputs with defaults for what is not given (one sample per client, ids 0..K-1, one layer):
        for tests and notebooks that call an aggregator directly."""
        k, p = client_params.shape
        device = client_params.device
        num_samples = torch.ones(k, dtype=torch.long, device=device) if num_samples is None else num_samples
        client_ids = torch.arange(k, device=device) if client_ids is None else client_ids
        layout = ParamLayout(("params",), (torch.Size([p]),), (0, p)) if layout is None else layout
        if all_num_samples is None:  # only the participants are known: every other id holds nothing
            all_num_samples = num_samples.new_zeros(int(client_ids.max()) + 1).index_copy(0, client_ids, num_samples)
        return cls(global_params, client_params, num_samples, client_ids, round, layout, all_num_samples, **optional)
