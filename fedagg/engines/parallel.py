"""`engine=parallel`: a round's clients trained together on stacked weights.

Clients are ordered by their number of local steps and cut into chunks of at most
`chunk_size`; a chunk's parameters, buffers and momentum live as [K, ...] tensors, and
every local step is one vmapped forward of the packed model (engines/_packed.py) over
the clients still training, one ordinary backward, and one step of the trainer's SGD.
Batches, loss and optimizer arithmetic are the trainer's (fedagg.clients.trainer), the
same the sequential engine runs one client at a time, so for the same seed this engine
reproduces `SequentialEngine` to float tolerance: the reference it is tested against.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Annotated, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from fedagg.clients.client import ClientData
from fedagg.clients.trainer import LocalSGD
from fedagg.clients.validation import ValidationPlan
from fedagg.config.constraints import Range, checked
from fedagg.data.device import targets
from fedagg.engines._packed import pack, stacked_channels_last
from fedagg.engines.base import Engine, RoundJob, RoundResult, local_steps, stack_payloads
from fedagg.engines.memory import CPU_CHUNK, auto_chunk_size
from fedagg.models.flat import unflatten

ChunkSize = Annotated[int | str, Range(ge=1, integer=True, also=("auto",), words="use auto or an integer >= 1")]
log = logging.getLogger(__name__)


class ParallelEngine(Engine):
    @checked("engine.")
    def __init__(self, eval_batch_size: Annotated[int, Range(ge=1, integer=True)] = 1024, chunk_size: ChunkSize = "auto",
                 precision: Literal["fp32", "bf16"] = "fp32", channels_last: bool = False, compile: bool = False) -> None:
        super().__init__(eval_batch_size)
        self.chunk_size: int | str = chunk_size  # "auto" until the first round resolves it (engines/memory.py)
        self.precision, self.channels_last, self.compile = precision, bool(channels_last), bool(compile)
        self._model: nn.Module | None = None

    @property
    def clients_in_memory(self) -> int:
        return CPU_CHUNK if self.chunk_size == "auto" else self.chunk_size

    def _resolve_chunk_size(self, job: RoundJob) -> None:
        """`auto`: as many clients as the device holds (engines/memory.py), chosen once, at the first round."""
        if self.chunk_size != "auto":
            return
        data = job.data
        sample = data.prepare(data.train_x[:1])[0]
        resident = sum(t.numel() * t.element_size() for t in (data.train_x, data.train_y, data.test_x, data.test_y))
        self.chunk_size = auto_chunk_size(job.model, sample, job.trainer.batch_size, len(job.clients), resident)
        log.info("engine.chunk_size=auto: %d clients at once on %s", self.chunk_size, sample.device)

    def check(self, trainer: LocalSGD) -> None:
        if not trainer.stackable:
            raise ValueError(f"engine=parallel cannot stack client objective {type(trainer.objective).__name__} "
                             "(it declares stackable = False); use engine=sequential")

    def _prepare_model(self, model: nn.Module) -> None:
        """Pack the model once (it keeps its structure from round to round)."""
        if self._model is model:
            return
        self._model = model
        self._packed, self._ctx = pack(model)
        self._ctx.channels_last = self.channels_last
        self._pnames = [n for n, _ in model.named_parameters()]
        self._bnames = [n for n, _ in model.named_buffers()]
        self._pshapes = [p.shape for p in model.parameters()]
        self._btemplates = [b for b in model.buffers()]
        # with and without per-client objective state
        self._train_fns = [vmap(self._client_loss, in_dims=(0, 0, 0, 0, None, d)) for d in (None, 0)]
        self._eval_fn = vmap(self._client_logits, in_dims=(0, 0, 0))
        # compiled for full batches; the few partial ones run eagerly rather than compile their shapes
        self._compiled = [torch.compile(f) for f in self._train_fns] if self.compile else None
        if self.compile:
            self._eval_fn = torch.compile(self._eval_fn)

    def _autocast(self, device: torch.device):
        if self.precision == "bf16":
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _client_logits(self, params, buffers, x):
        tensors = (dict(zip(self._pnames, params)), dict(zip(self._bnames, buffers)))
        return functional_call(self._packed, tensors, (x,))

    def _client_loss(self, params, buffers, x, y, anchor, state):
        """One client's (objective, task loss) on its batch: the trainer's loss under vmap."""
        return self._trainer.loss(self._client_logits(params, buffers, x), y, list(params), anchor, state)

    def _stacked_buffers(self, flat: Tensor, k: int) -> list[Tensor]:
        """k copies of every buffer; like fedagg.models.flat.set_buffers, integer buffers come back rounded."""
        out = []
        for chunk, b in zip(unflatten(flat, [b.shape for b in self._btemplates]), self._btemplates):
            chunk = chunk.round() if not b.dtype.is_floating_point else chunk
            out.append(chunk.to(b.dtype).unsqueeze(0).repeat(k, *[1] * b.dim()).contiguous())
        return out

    def train_round(self, job: RoundJob) -> RoundResult:
        """Train `job.clients` from the global weights; score each on `job.val_indices[k]` when given."""
        self._prepare_model(job.model)
        self._resolve_chunk_size(job)
        self._trainer = job.trainer  # read by the vmapped loss
        clients, val_indices = job.clients, job.val_indices
        steps = job.steps()
        order = sorted(range(len(clients)), key=lambda k: -steps[k])  # stable: ties keep the round's order
        n_chunks = -(-len(clients) // self.chunk_size)
        bounds = [len(clients) * i // n_chunks for i in range(n_chunks + 1)]  # chunks of near-equal size
        device = job.global_params.device
        params = job.global_params.new_empty(len(clients), job.global_params.numel())
        buffers = job.global_buffers.new_empty(len(clients), job.global_buffers.numel())
        losses = torch.empty(len(clients), device=device)
        accs = torch.empty(len(clients), device=device) if val_indices is not None else None
        payloads: list[dict | None] = [None] * len(clients)
        for lo, hi in zip(bounds, bounds[1:]):
            idx = order[lo:hi]
            chunk = [clients[k] for k in idx]
            budgets = None if job.budgets is None else [job.budgets[k] for k in idx]
            flat, flat_buffers, mean_losses, sent, P, Bf = self._train_chunk(job, chunk, budgets)
            rows = torch.tensor(idx, device=device)
            params[rows], buffers[rows], losses[rows] = flat, flat_buffers, mean_losses
            for k, payload in zip(idx, sent):
                payloads[k] = payload
            if val_indices is not None:
                accs[rows] = self._accuracy(P, Bf, [val_indices[k] for k in idx], job.data)
        return RoundResult(params=params, buffers=buffers, train_loss=losses, val_acc=accs,
                           local_steps=local_steps(job), payloads=stack_payloads(payloads))

    def _train_chunk(self, job: RoundJob, clients: list[ClientData], budgets: list[int] | None):
        """Train one chunk; returns flat params [k, P], flat buffers [k, B], mean task losses [k],
        payloads, and the stacked per-tensor parameters and buffers."""
        k, trainer, global_params = len(clients), job.trainer, job.global_params
        plan = trainer.plan(clients, job.data, seed=job.seed, round=job.round, budgets=budgets)
        P = [p.unsqueeze(0).repeat(k, *[1] * len(p.shape)).contiguous()
             for p in unflatten(global_params, self._pshapes)]  # per parameter tensor, [k, ...]
        if self.channels_last:  # convolution weights laid out as their packed forward reads them
            P = [stacked_channels_last(p) if p.dim() == 5 else p for p in P]
        Bf = self._stacked_buffers(job.global_buffers, k)  # per buffer, [k, ...]
        sgd = trainer.optimizer(P, clients, job.lr)
        anchor = [a.clone() for a in unflatten(global_params, self._pshapes)]
        state = trainer.objective_state(clients, global_params, self._pshapes)
        loss_sum = torch.zeros(k, device=global_params.device)
        self._packed.train()
        for t in range(len(plan)):
            for n, sel in plan.groups[t]:
                x, y = plan.batch(t, n, sel)
                x, y = x.view(-1, n, *x.shape[1:]), y.view(-1, n, *y.shape[1:])  # [g, n, ...]: one batch per client
                leaves = [p[sel].detach().requires_grad_() for p in P]
                buffers = [b[sel] for b in Bf]  # BatchNorm updates these in place
                fns = self._compiled if self._compiled is not None and n == plan.batch_size else self._train_fns
                with self._autocast(global_params.device):
                    total, task = fns[state is not None](leaves, buffers, x, y, anchor,
                                                         None if state is None else [s[sel] for s in state])
                grads = torch.autograd.grad(total.sum(), leaves)
                sgd.step(list(grads), sel)
                if not isinstance(sel, slice):  # a gathered group: write its statistics back
                    for b, new in zip(Bf, buffers):
                        b[sel] = new
                loss_sum[sel] += task * n
        flat = torch.cat([p.reshape(k, -1) for p in P], 1)
        sent = trainer.finish(plan, clients, flat, global_params, sgd, job.model, job.lr)
        flat_buffers = torch.cat([b.reshape(k, -1).float() for b in Bf], 1) if Bf else flat.new_zeros(k, 0)
        return flat, flat_buffers, trainer.mean_loss(loss_sum, plan), sent, P, Bf

    @torch.no_grad()
    def _accuracy(self, P: list[Tensor], Bf: list[Tensor], val_idx: list[Tensor], data) -> Tensor:
        """Accuracy of each trained client model [K] on its own indices, in eval mode, evaluated together."""
        plan = ValidationPlan(val_idx, self.eval_batch_size)
        correct = plan.counter(len(val_idx), data, P[0].device)
        self._packed.eval()
        for idx, real in plan:
            x = data.prepare(data.train_images(idx.reshape(-1)))
            with self._autocast(P[0].device):
                logits = self._eval_fn(P, Bf, x.view(*idx.shape, *x.shape[1:]))
            correct += plan.correct(logits, targets(data, "train", idx), real)
        self._packed.train()
        return plan.accuracy(correct)
