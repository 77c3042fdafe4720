"""`engine=parallel`: a round's clients trained together on stacked weights.

Clients are ordered by their number of local steps and cut into chunks of at most
`chunk_size`; a chunk's parameters, buffers and momentum live as [K, ...] tensors, and
every local step is one vmapped forward of the packed model (fedagg.engines._packed) over the
clients still training, one ordinary backward, and one StackedSGD step. Batches, shuffling
and augmentation come from each client's own stream in the order a client trained alone
draws them (fedagg.clients.batches), so for the same seed this engine reproduces
`SequentialEngine` to float tolerance: the reference it is tested against.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vmap

from fedagg.clients.trainer import ClientData, LocalSGD
from fedagg.clients.batches import BatchPlan, num_steps
from fedagg.engines.sequential import RoundResult
from fedagg.clients.stacked_sgd import StackedSGD
from fedagg.engines._packed import pack

PRECISIONS = ("fp32", "bf16")


class ParallelEngine:
    def __init__(self, eval_batch_size: int = 1024, chunk_size: int = 64, precision: str = "fp32",
                 channels_last: bool = False, compile: bool = False) -> None:
        if eval_batch_size < 1:
            raise ValueError(f"engine.eval_batch_size={eval_batch_size!r} is not allowed; it must be >= 1")
        if chunk_size < 1:
            raise ValueError(f"engine.chunk_size={chunk_size!r} is not allowed; it must be >= 1")
        if precision not in PRECISIONS:
            raise ValueError(f"engine.precision={precision!r} is not allowed; choose one of {', '.join(PRECISIONS)}")
        self.eval_batch_size, self.chunk_size = int(eval_batch_size), int(chunk_size)
        self.precision, self.channels_last, self.compile = precision, bool(channels_last), bool(compile)
        self._model: nn.Module | None = None

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
        return functional_call(self._packed, tensors, (x,)).float()

    def _client_loss(self, params, buffers, x, y, anchor, state):
        """One client's (objective, task loss) on its batch."""
        task = F.cross_entropy(self._client_logits(params, buffers, x), y)
        extra = self._objective.penalty(list(params), anchor, state)
        return (task if extra is None else task + extra), task.detach()

    def _unflatten(self, flat: Tensor, k: int) -> list[Tensor]:
        """[P] -> per-parameter [k, ...] copies."""
        parts = flat.split([s.numel() for s in self._pshapes])
        return [p.view(s).unsqueeze(0).repeat(k, *[1] * len(s)).contiguous() for p, s in zip(parts, self._pshapes)]

    def _unflatten_buffers(self, flat: Tensor, k: int) -> list[Tensor]:
        """Like fedagg.models.flat.set_buffers: integer buffers come back rounded."""
        out, offset = [], 0
        for b in self._btemplates:
            chunk = flat[offset: offset + b.numel()].view_as(b)
            chunk = chunk.round() if not b.dtype.is_floating_point else chunk
            out.append(chunk.to(b.dtype).unsqueeze(0).repeat(k, *[1] * b.dim()).contiguous())
            offset += b.numel()
        return out

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
        self._prepare_model(model)
        self._objective = trainer.objective  # read by the vmapped loss
        steps = [num_steps(c.num_samples, trainer.batch_size, trainer.local_epochs) for c in clients]
        order = sorted(range(len(clients)), key=lambda k: -steps[k])  # stable: ties keep the round's order
        n_chunks = -(-len(clients) // self.chunk_size)
        bounds = [len(clients) * i // n_chunks for i in range(n_chunks + 1)]  # chunks of near-equal size
        device = global_params.device
        params = global_params.new_empty(len(clients), global_params.numel())
        buffers = global_buffers.new_empty(len(clients), global_buffers.numel())
        losses = torch.empty(len(clients), device=device)
        accs = torch.empty(len(clients), device=device) if val_indices is not None else None
        for lo, hi in zip(bounds, bounds[1:]):
            idx = order[lo:hi]
            out = self._train_chunk(model, global_params, global_buffers, [clients[k] for k in idx], trainer, data,
                                    lr=lr, seed=seed, round=round)
            rows = torch.tensor(idx, device=device)
            params[rows], buffers[rows], losses[rows] = out[0], out[1], out[2]
            if val_indices is not None:
                accs[rows] = self._accuracy(out[3], out[4], [val_indices[k] for k in idx], data)
        return RoundResult(params=params, buffers=buffers, train_loss=losses, val_acc=accs)

    def _train_chunk(self, model, global_params, global_buffers, clients, trainer, data, *, lr, seed, round):
        """Train one chunk; returns flat params [k, P], flat buffers [k, B], mean losses [k] and the stacked
        per-tensor parameters and buffers."""
        k = len(clients)
        plan = BatchPlan(clients, data, batch_size=trainer.batch_size, epochs=trainer.local_epochs,
                         seed=seed, round=round)
        P = self._unflatten(global_params, k)  # per parameter tensor, [k, ...]
        Bf = self._unflatten_buffers(global_buffers, k)  # per buffer, [k, ...]
        keep = trainer.keep_optimizer_state
        saved = [trainer.optimizer_states.get(c.id) if keep else None for c in clients]
        sgd = StackedSGD(P, lr=lr, momentum=trainer.momentum, nesterov=trainer.nesterov,
                         weight_decay=trainer.weight_decay, saved=saved)
        objective = trainer.objective
        anchor = [a.view(s).clone() for a, s in zip(global_params.split([s.numel() for s in self._pshapes]),
                                                    self._pshapes)]
        states = [objective.client_state(c.id, global_params) for c in clients]
        state = None
        if states[0] is not None:
            state = [s.view(k, *shape) for s, shape in zip(torch.stack(states).split(
                [s.numel() for s in self._pshapes], dim=1), self._pshapes)]
        loss_sum = torch.zeros(k, device=global_params.device)
        self._packed.train()
        for t in range(len(plan)):
            for n, sel in plan.groups[t]:
                x, y = plan.batch(t, n, sel)
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
        if keep:
            for c, sd in zip(clients, sgd.state_dicts(model)):
                trainer.optimizer_states[c.id] = sd
        flat = torch.cat([p.reshape(k, -1) for p in P], 1)
        for c, row in zip(clients, flat):
            objective.after_training(c.id, row, global_params)
        flat_buffers = torch.cat([b.reshape(k, -1).float() for b in Bf], 1) if Bf else flat.new_zeros(k, 0)
        sizes = torch.tensor([c.num_samples for c in clients], device=flat.device, dtype=torch.float32)
        return flat, flat_buffers, loss_sum / (sizes * trainer.local_epochs), P, Bf

    @torch.no_grad()
    def _accuracy(self, P: list[Tensor], Bf: list[Tensor], val_idx: list[Tensor], data) -> Tensor:
        """Accuracy of each trained client model [K] on its own indices, in eval mode, evaluated together."""
        k = len(val_idx)
        lengths = torch.tensor([v.numel() for v in val_idx])
        longest = int(lengths.max()) if k else 0
        correct = torch.zeros(k, device=P[0].device)
        self._packed.eval()
        step = max(1, self.eval_batch_size // k)
        device = P[0].device
        for start in range(0, longest, step):
            cols = torch.arange(start, min(start + step, longest))
            real = cols.view(1, -1) < lengths.view(-1, 1)  # [K, b]
            idx = torch.stack([v[cols.clamp(max=max(v.numel() - 1, 0)).to(v.device)] if v.numel() else
                               torch.zeros(len(cols), dtype=torch.long, device=v.device) for v in val_idx])
            x = data.prepare(data.train_x[idx.reshape(-1)])
            y = data.train_y[idx]
            with self._autocast(device):
                logits = self._eval_fn(P, Bf, x.view(k, len(cols), *x.shape[1:]))
            correct += ((logits.argmax(-1) == y) & real.to(y.device)).sum(1)
        self._packed.train()
        return torch.where(lengths.to(device) > 0, correct / lengths.clamp(min=1).to(device), 0.0)
