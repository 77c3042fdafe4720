"""The forward pass of local training as an objective sees it, defined once for every engine.

`forward_terms` is what one client computes on one batch: the logits its task loss is taken of
and the objective's term (its parameter penalty plus what it reads of the forward pass). An
engine supplies only `forward(params, buffers, x, represent=, frozen=)`: the model being
trained (`frozen=False`, train mode; the sequential engine runs its working model, the
parallel engine the packed copy on one client's stacked weights under vmap) or another model
of the same structure on the same batch (`frozen=True`: the round's global model, the
client's previous model), in eval mode and, as `forward_terms` calls it, without gradients.
What the objective declared in its `Sees` is all that runs: a plain objective costs one
forward, as before.

The per-client inputs (`ClientInputs`: objective state, previous model, label counts) and
what a run's clients share (`RunInputs`: the global model) are built here from the trainer's
stores, as [k, ...] stacks that the parallel engine vmaps over and the sequential engine
takes row 0 of.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fedagg.clients.client import ClientData
from fedagg.clients.objectives import Objective, Seen
from fedagg.clients.store import ClientStore
from fedagg.data.device import targets
from fedagg.models.base import Representation
from fedagg.models.flat import unflatten

Forward = Callable[..., Representation]  # forward(params, buffers, x, *, represent: bool, frozen: bool)


class RunInputs(NamedTuple):
    """What a run's clients share in a round (stacked per client when several runs share a call)."""

    anchor: list[Tensor]  # the global parameters, one tensor per parameter
    global_buffers: list[Tensor] | None = None  # the global buffers, when the objective sees the global model


class ClientInputs(NamedTuple):
    """Each client's own inputs to its loss, [k, ...] per tensor (one client's rows under vmap)."""

    state: list[Tensor] | None = None  # the objective's per-client state (FedDyn's g_k, SCAFFOLD's c - c_k)
    previous: tuple[list[Tensor], list[Tensor]] | None = None  # the previous model's parameters and buffers
    has_previous: Tensor | None = None  # [k] bool, when some of the clients have no previous model
    label_counts: Tensor | None = None  # [k, C] float


class Terms(NamedTuple):
    """What one client's batch gives its loss."""

    logits: Tensor  # the local model's own
    task_logits: Tensor  # those the task's cross-entropy is taken of (FedLC's calibrated ones; else `logits`)
    extra: Tensor | None  # the objective's term


def forward_terms(objective: Objective, forward: Forward, params: list[Tensor], buffers: list[Tensor], x: Tensor,
                  y: Tensor, run: RunInputs, own: ClientInputs) -> Terms:
    """The logits, the logits one client's task loss is taken of and the objective's term (or None), on its batch."""
    sees = objective.sees
    if not objective.reads_forward:  # the forward before the penalty: the order autograd sums their gradients in
        logits = forward(params, buffers, x, represent=False, frozen=False).logits
        return Terms(logits, logits, objective.penalty(list(params), run.anchor, own.state))
    local = forward(params, buffers, x, represent=sees.representation, frozen=False)
    extra = objective.penalty(list(params), run.anchor, own.state)
    reference = previous = None
    with torch.no_grad():
        if sees.global_model:
            reference = forward(run.anchor, run.global_buffers, x, represent=sees.representation, frozen=True)
        if own.previous is not None:
            previous = forward(*own.previous, x, represent=sees.representation, frozen=True)
    seen = Seen(y, local, reference, previous, own.has_previous, own.label_counts)
    term = objective.forward_term(seen)
    if term is not None:
        extra = term if extra is None else extra + term
    return Terms(local.logits, objective.task_logits(seen), extra)


class _Represents(nn.Module):
    """`functional_call` runs a module's forward; this one's forward is its backbone's `represent`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Representation:
        return self.model.represent(x)


def call(model: nn.Module, params: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor,
         represent: bool) -> Representation:
    """`model` on `x` with these tensors in place of its own (torch.func.functional_call), as a Representation."""
    if not represent:
        return Representation(None, functional_call(model, (params, buffers), (x,)))
    prefixed = ({f"model.{n}": t for n, t in params.items()}, {f"model.{n}": t for n, t in buffers.items()})
    return functional_call(_Represents(model), prefixed, (x,))


def frozen_call(model: nn.Module, params: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor,
                represent: bool) -> Representation:
    """`call` in eval mode (BatchNorm reads its running statistics and leaves them), the mode put back after."""
    was = model.training
    model.eval()
    try:
        return call(model, params, buffers, x, represent)
    finally:
        model.train(was)


def buffers_as(flat: Tensor, templates: list[Tensor]) -> list[Tensor]:
    """Flat buffers [..., B] as one tensor per buffer in its own dtype (integer ones rounded), like set_buffers."""
    out = []
    for chunk, b in zip(unflatten(flat, [b.shape for b in templates]), templates):
        out.append((chunk.round() if not b.dtype.is_floating_point else chunk).to(b.dtype))
    return out


def run_inputs(objective: Objective, global_params: Tensor, global_buffers: Tensor, shapes: list[torch.Size],
               templates: list[Tensor]) -> RunInputs:
    anchor = [a.clone() for a in unflatten(global_params, shapes)]
    if not objective.sees.global_model:
        return RunInputs(anchor)
    return RunInputs(anchor, buffers_as(global_buffers, templates))


def client_inputs(objective: Objective, clients: list[ClientData], data, global_params: Tensor,
                  global_buffers: Tensor, shapes: list[torch.Size], templates: list[Tensor],
                  previous_models: ClientStore, complete: bool = False) -> ClientInputs:
    """The clients' own inputs, stacked [k, ...]. A client without a previous model gets the global one as a
    stand-in (finite, and masked out by `has_previous`); when none of them has one, `previous` is None, unless
    `complete` (the parallel engine, which joins several runs' clients: every field present, so stacks join)."""
    sees, device = objective.sees, global_params.device
    states = [objective.client_state(c.id, global_params) for c in clients]
    state = None if states[0] is None else unflatten(torch.stack(states), shapes)
    previous = has = counts = None
    if sees.previous_model:
        kept = [previous_models.get(c.id) for c in clients]
        if complete or any(row is not None for row in kept):
            whole = torch.cat([global_params, global_buffers])
            rows = torch.stack([whole if row is None else row.to(device) for row in kept])
            p = global_params.numel()
            previous = (unflatten(rows[:, :p], shapes), buffers_as(rows[:, p:], templates))
            if complete or not all(row is not None for row in kept):
                has = torch.tensor([row is not None for row in kept], device=device)
    if sees.label_counts:
        counts = torch.stack([torch.bincount(targets(data, "train", c.train_idx).flatten(),
                                             minlength=data.num_classes) for c in clients]).float().to(device)
    return ClientInputs(state, previous, has, counts)


def joined(parts: list[ClientInputs]) -> ClientInputs:
    """Several stacks' inputs one after another (each `complete`, so all hold the same fields)."""
    if len(parts) == 1:
        return parts[0]
    cat = lambda ts: None if ts[0] is None else torch.cat(ts)
    state = None if parts[0].state is None else [torch.cat(s) for s in zip(*(p.state for p in parts))]
    previous = None if parts[0].previous is None else tuple(
        [torch.cat(t) for t in zip(*(p.previous[i] for p in parts))] for i in range(2))
    return ClientInputs(state, previous, cat([p.has_previous for p in parts]), cat([p.label_counts for p in parts]))


def rows(inputs: ClientInputs, sel) -> ClientInputs:
    """The inputs of the clients `sel` selects (a range or an index tensor) of a stack."""
    pick = lambda t: None if t is None else t[sel]
    previous = None if inputs.previous is None else tuple([t[sel] for t in part] for part in inputs.previous)
    state = None if inputs.state is None else [s[sel] for s in inputs.state]
    return ClientInputs(state, previous, pick(inputs.has_previous), pick(inputs.label_counts))
