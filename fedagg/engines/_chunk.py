"""A chunk of the parallel engine: each run's clients in it (`Part`) and the helpers of a stacked step.

A part holds one run's clients of a chunk (most steps first), its SGD (and sensitivity) on its block
of the chunk's stacked tensors, the inputs its clients' loss reads (fedagg/clients/forward.py), and
what its training gives back. Runs whose trainers give the same `loss_key` share one vmapped call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fedagg.clients.forward import ClientInputs, RunInputs, joined
from fedagg.clients.forward import rows as client_rows
from fedagg.clients.trainer import LocalSGD
from fedagg.engines.base import RoundJob
from fedagg.models.flat import unflatten


def count(sel, k: int) -> int:
    """How many clients a group's selection (a range or an index tensor) holds, of a part of k."""
    return len(range(k)[sel]) if isinstance(sel, slice) else sel.numel()


def loss_key(trainer: LocalSGD) -> tuple:
    """What decides a client's loss function beyond its weights and batch: runs whose trainers give the same key
    share one vmapped call (their objective's type and settings, its per-client state an argument; what the
    step differentiates besides the loss)."""
    objective = trainer.objective
    settings = sorted((k, v) for k, v in vars(objective).items() if isinstance(v, (bool, int, float, str)))
    return type(objective).__qualname__, type(objective).__module__, tuple(settings), trainer.sensitivity


@dataclass
class Stack:
    """A chunk's stacked tensors, [k, ...] each: parameters, buffers and (several runs) anchors."""

    params: list[Tensor]
    buffers: list[Tensor]
    anchors: list[Tensor]


def map_tensors(fn, obj):
    """`fn` on every tensor of a (nested) tuple or list of tensors and Nones."""
    if obj is None:
        return None
    if isinstance(obj, Tensor):
        return fn(obj)
    items = [map_tensors(fn, o) for o in obj]
    return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)


def chunk_rows(group: list, device: torch.device) -> slice | Tensor:
    """The chunk's rows of a step's clients, part after part: a range where they are one, else an index."""
    spans = [range(part.offset + sel.start, part.offset + sel.stop) if isinstance(sel, slice) else sel + part.offset
             for part, _, sel in group]
    if all(isinstance(s, range) for s in spans) and all(a.stop == b.start for a, b in zip(spans, spans[1:])):
        return slice(spans[0].start, spans[-1].stop)
    return torch.cat([torch.arange(s.start, s.stop, device=device) if isinstance(s, range) else s for s in spans])


def twice(t: Tensor) -> Tensor:
    """[1, ...] -> [2, ...]: the row beside a detached copy of itself (gradients reach only the first)."""
    return torch.cat([t, t.detach()])


class Part:
    """One run's clients in a chunk (most steps first), its SGD on its block of the stacked tensors, and what
    its training gives back."""

    def __init__(self, job: RoundJob, idx: list[int]) -> None:
        self.job, self.idx = job, idx
        self.clients = [job.clients[k] for k in idx]
        budgets = None if job.budgets is None else [job.budgets[k] for k in idx]
        self.plan = job.trainer.plan(self.clients, job.data, seed=job.seed, round=[job.draw(k) for k in idx],
                                     budgets=budgets)
        self.loss_key = loss_key(job.trainer)
        self.starts = job.trainer.starts(self.clients, job.global_params, job.global_buffers)
        # a batch's samples must not interact: an objective that reads the forward pass (FedDecorr's batch
        # statistics, MOON's and FedNTD's means) sees only the client's real samples, never a filled-up batch
        self.fills = not job.trainer.objective.reads_forward

    def initial_params(self, shapes: list[torch.Size]) -> list[Tensor]:
        k = len(self.clients)
        if self.starts is not None:  # each client from a model of its own (FedBN's local layers)
            return [p.contiguous() for p in unflatten(self.starts[0], shapes)]
        return [p.unsqueeze(0).repeat(k, *[1] * len(p.shape)).contiguous()
                for p in unflatten(self.job.global_params, shapes)]  # per parameter tensor, [k, ...]

    def bind(self, P: list[Tensor], Bf: list[Tensor], offset: int, shapes: list[torch.Size],
             templates: list[Tensor]) -> None:
        job, k = self.job, len(self.clients)
        self.offset, rows = offset, slice(offset, offset + k)
        self.P, self.Bf = [p[rows] for p in P], [b[rows] for b in Bf]  # views: steps write into the stack
        self.sgd = job.trainer.optimizer(self.P, self.clients, job.lr, job.model)
        self.tracker = job.trainer.tracker(self.P, self.clients)
        self.run = job.trainer.run_inputs(job.global_params, job.global_buffers, shapes, templates)
        self.own = job.trainer.client_inputs(self.clients, job.data, job.global_params, job.global_buffers, shapes,
                                             templates, complete=True)
        self.loss_sum = torch.zeros(k, device=job.global_params.device)

    def finish(self) -> None:
        job, k = self.job, len(self.clients)
        self.flat = torch.cat([p.reshape(k, -1) for p in self.P], 1)
        self.flat_buffers = (torch.cat([b.reshape(k, -1).float() for b in self.Bf], 1) if self.Bf
                             else self.flat.new_zeros(k, 0))
        self.sent, self.sensitivity = job.trainer.finish(self.plan, self.clients, self.flat, self.flat_buffers,
                                                         job.global_params, self.sgd, self.tracker, job.lr)
        self.losses = job.trainer.mean_loss(self.loss_sum, self.plan)


def group_inputs(group: list, anchor: list[Tensor]) -> tuple[RunInputs, ClientInputs]:
    """The inputs of a step over several runs' clients (one loss, so the same fields): each client's run's global
    model (`anchor`: the group's rows of the chunk's anchors) and buffers, and the clients' own inputs."""
    first = group[0][0].run.global_buffers
    buffers = None if first is None else [torch.cat(ts) for ts in zip(*(
        [b.expand(len(part.clients), *b.shape)[sel] for b in part.run.global_buffers] for part, _, sel in group))]
    return RunInputs(anchor, buffers), joined([client_rows(part.own, sel) for part, _, sel in group])
