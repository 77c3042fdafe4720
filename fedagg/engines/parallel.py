"""`engine=parallel`: a round's clients trained together on stacked weights.

Clients are ordered by their number of local steps and cut into chunks of at most
`chunk_size`; a chunk's parameters, buffers and momentum live as [K, ...] tensors, and
every local step is one vmapped forward of the packed model (engines/_packed.py) over
the clients still training, one ordinary backward, and one step of the trainer's SGD.
A client's partial last batch is filled up with its own first sample and weighed zero in
its loss, so a step is one call whatever the batch sizes (not for BatchNorm, whose batch
statistics the filling would change: there a step is one call per batch size).
Batches, loss and optimizer arithmetic are the trainer's (fedagg.clients.trainer), the
same the sequential engine runs one client at a time, so for the same seed this engine
reproduces `SequentialEngine` to float tolerance (dropout's masks aside): the reference it is
tested against. A client's arithmetic does not depend on which clients share its call (its
dropout masks do: the call draws them together), so the runs of a stacked sweep
(fedagg.loop.drivers.run_in_step) get what each gets alone, bit for bit where the kernels allow (linear
layers; convolutions per client on the CPU's large batches; an objective's softplus or fractional power through
fedagg.clients.objectives.elementwise, which keeps the CPU's scalar tail off a client's values). Runs on one
dataset share its tensors, so a step's batches of all of them come from one gather, and a
step over several runs' clients takes their rows of the chunk's stacks (views where the
rows are one range) rather than joining every run's block.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Annotated, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from fedagg.models.adapters.frozen import plain_tensors

from fedagg.clients.batches import gather
from fedagg.clients.forward import ClientInputs, RunInputs, buffers_as, call, frozen_call
from fedagg.clients.forward import rows as client_rows
from fedagg.clients.trainer import LocalSGD
from fedagg.clients.validation import ValidationPlan
from fedagg.config.constraints import Range, checked
from fedagg.data.device import targets
from fedagg.seeding import global_rng, stream_seed
from fedagg.engines._chunk import Part, Stack, chunk_rows, count, group_inputs, map_tensors, twice
from fedagg.engines._packed import pack, stacked_channels_last
from fedagg.engines.base import Engine, RoundJob, RoundResult, local_steps, stack_payloads
from fedagg.engines.memory import CPU_CHUNK, auto_chunk_size
from fedagg.models.base import Representation
from fedagg.models.flat import unflatten
from fedagg.runtime.heap import keep_freed_memory

ChunkSize = Annotated[int | str, Range(ge=1, integer=True, also=("auto",), words="use auto or an integer >= 1")]
log = logging.getLogger(__name__)


def _structure(model: nn.Module) -> list:
    # a frozen base (adapters) is part of what the packed copy computes with: another model's base is another model
    return [(n, t.shape, t.dtype) for n, t in (*model.named_parameters(), *model.named_buffers())] + \
        [id(t) for t in plain_tensors(model)]


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

    def _resolve_chunk_size(self, jobs: list[RoundJob], say: bool = True) -> None:
        """`auto`: as many clients as the device holds (engines/memory.py), chosen once, at the first round, for
        every client of `jobs` (several runs' when a sweep is stacked) and the data they keep on the device.
        `say`: log the choice (a stacked job's own engine, which only sizes its aggregator's blocks, does not)."""
        if self.chunk_size != "auto":
            return
        job, data = jobs[0], jobs[0].data
        sample = data.prepare(data.train_x[:1])[0]
        # the runs' data tensors, each counted once (runs on one dataset share them: fedagg.data.device.shared)
        held = {id(t): t for j in jobs for t in (j.data.train_x, j.data.train_y, j.data.test_x, j.data.test_y)}
        resident = sum(t.numel() * t.element_size() for t in held.values())
        self.chunk_size = auto_chunk_size(job.model, sample, job.trainer.batch_size,
                                          sum(len(j.clients) for j in jobs), resident)
        if say:
            log.info("engine.chunk_size=auto: %d clients at once on %s", self.chunk_size, sample.device)

    def check(self, trainer: LocalSGD) -> None:
        if not trainer.stackable:
            raise ValueError(f"engine=parallel cannot stack client objective {type(trainer.objective).__name__} "
                             "(it declares stackable = False); use engine=sequential")

    def _prepare_model(self, model: nn.Module) -> None:
        """Pack the model once (it keeps its structure from round to round; the runs of a stacked sweep share
        one structure, and the packed copy runs on the weights it is given, never on its own)."""
        if self._model is model or (self._model is not None and _structure(self._model) == _structure(model)):
            return
        self._model = model
        self._packed, self._ctx = pack(model)
        self._ctx.channels_last = self.channels_last
        self._pnames = [n for n, _ in model.named_parameters()]
        self._bnames = [n for n, _ in model.named_buffers()]
        self._pshapes = [p.shape for p in model.parameters()]
        self._btemplates = [b for b in model.buffers()]
        self._train_fns = {}  # by (several runs in the call, which inputs are present): see _train_fn
        self._eval_fn = vmap(self._client_logits, in_dims=(0, 0, 0))
        # a batch's samples interact only through BatchNorm's statistics: without it, partial batches are filled up
        # to full ones and a step's clients train in one call (the loss weighs the filling zero)
        self._pad = not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
        if self.compile:
            self._eval_fn = torch.compile(self._eval_fn)

    def _autocast(self, device: torch.device):
        if self.precision == "bf16":
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _client_logits(self, params, buffers, x):
        tensors = (dict(zip(self._pnames, params)), dict(zip(self._bnames, buffers)))
        return functional_call(self._packed, tensors, (x,))

    def _client_forward(self, params, buffers, x, y, run, own):
        """One client's (logits its task loss is taken of, objective term) on its batch, as the trainer defines them
        (fedagg/clients/forward.py); the task loss is taken outside vmap, for all the step's clients at once
        (`LocalSGD.stacked_task_losses`: under vmap cross-entropy decomposes into many small operations)."""
        terms = self._trainer.forward_terms(self._forward, params, buffers, x, y, run, own)
        return terms.logits, terms.task_logits, params[0].new_zeros(()) if terms.extra is None else terms.extra

    def _train_fn(self, run: RunInputs, own: ClientInputs, several: bool, compiled: bool):
        """`_client_forward` vmapped over (params, buffers, x, y, the run's shared inputs, each client's own): the
        shared ones per client when several runs share the call; an input that is None stays None."""
        key = (several, compiled, repr(map_tensors(lambda t: 0, run)), repr(map_tensors(lambda t: 0, own)))
        if key not in self._train_fns:
            dims = (0, 0, 0, 0, map_tensors(lambda t: 0 if several else None, run), map_tensors(lambda t: 0, own))
            # a model with dropout (cnn_emnist_tff) draws a mask per client, as clients trained one by one would;
            # the masks come from torch's generator, seeded per round in train_rounds: not those of the sequential
            # engine (it seeds per client), and they depend on the call's clients (the stacked launcher runs such a
            # job alone)
            fn = vmap(self._client_forward, in_dims=dims, randomness="different")
            self._train_fns[key] = torch.compile(fn) if compiled else fn
        return self._train_fns[key]

    def _forward(self, params, buffers, x, *, represent: bool, frozen: bool) -> Representation:
        """The packed model on one client's weights (the one training, or a frozen one in eval mode)."""
        tensors = dict(zip(self._pnames, params)), dict(zip(self._bnames, buffers))
        return (frozen_call if frozen else call)(self._packed, *tensors, x, represent)

    def _stacked_buffers(self, flat: Tensor, k: int) -> list[Tensor]:
        """k copies of every buffer; like fedagg.models.flat.set_buffers, integer buffers come back rounded."""
        out = []
        for chunk, b in zip(unflatten(flat, [b.shape for b in self._btemplates]), self._btemplates):
            chunk = chunk.round() if not b.dtype.is_floating_point else chunk
            out.append(chunk.to(b.dtype).unsqueeze(0).repeat(k, *[1] * b.dim()).contiguous())
        return out

    def train_round(self, job: RoundJob) -> RoundResult:
        """Train `job.clients` from the global weights; score each on `job.val_indices[k]` when given."""
        return self.train_rounds([job])[0]

    def train_rounds(self, jobs: list[RoundJob]) -> list[RoundResult]:
        """A round of several runs at once (a stacked sweep: fedagg.loop.drivers.run_in_step): models of one
        structure, each run with its own global weights, clients, data, trainer and learning rate. Every client's
        local training is its own computation, so each result is what `train_round(job)` gives that job alone."""
        groups = {}  # runs whose models hold frozen bases of their own (adapters) are trained one base at a time
        for j, job in enumerate(jobs):
            groups.setdefault(tuple(id(t) for t in plain_tensors(job.model)), []).append(j)
        if len(groups) > 1:
            out = [None] * len(jobs)
            for members in groups.values():
                for j, res in zip(members, self.train_rounds([jobs[j] for j in members])):
                    out[j] = res
            return out
        # what the model draws from torch's global generator (dropout's masks, for every client at once) comes from
        # a stream of the first run's seed and the round: a run's seed determines it, whatever ran before
        with global_rng(stream_seed(jobs[0].seed, "stacked_training_draws", jobs[0].round, len(jobs)),
                        jobs[0].global_params.device):
            return self._train_rounds(jobs)

    def _train_rounds(self, jobs: list[RoundJob]) -> list[RoundResult]:
        if jobs[0].global_params.device.type == "cpu":  # a stacked step's tens of MB, reused rather than faulted in
            keep_freed_memory()
        self._prepare_model(jobs[0].model)
        self._resolve_chunk_size(jobs)
        steps = [job.steps() for job in jobs]
        # every run's clients, ordered by their local steps (stable: ties keep the runs' and rounds' order)
        pairs = sorted(((j, k) for j, job in enumerate(jobs) for k in range(len(job.clients))),
                       key=lambda jk: -steps[jk[0]][jk[1]])
        n_chunks = -(-len(pairs) // self.chunk_size)
        bounds = [len(pairs) * i // n_chunks for i in range(n_chunks + 1)]  # chunks of near-equal size
        out = []
        for job in jobs:
            k_all, gp, gb = len(job.clients), job.global_params, job.global_buffers
            out.append(RoundResult(params=gp.new_empty(k_all, gp.numel()), buffers=gb.new_empty(k_all, gb.numel()),
                                   train_loss=torch.empty(k_all, device=gp.device),
                                   val_acc=torch.empty(k_all, device=gp.device) if job.val_indices is not None else None,
                                   local_steps=local_steps(job)))
        payloads: list[list[dict | None]] = [[None] * len(job.clients) for job in jobs]
        sensitivities: list[list[Tensor | None]] = [[None] * len(job.clients) for job in jobs]
        for lo, hi in zip(bounds, bounds[1:]):
            members = {}  # run -> its clients in this chunk, most steps first
            for j, k in pairs[lo:hi]:
                members.setdefault(j, []).append(k)
            parts = [Part(jobs[j], idx) for j, idx in sorted(members.items())]
            self._train_chunk(parts)
            for (j, idx), part in zip(sorted(members.items()), parts):
                res, job = out[j], jobs[j]
                rows = torch.tensor(idx, device=job.global_params.device)
                res.params[rows], res.buffers[rows], res.train_loss[rows] = part.flat, part.flat_buffers, part.losses
                for i, (k, payload) in enumerate(zip(idx, part.sent)):
                    payloads[j][k] = payload
                    sensitivities[j][k] = None if part.sensitivity is None else part.sensitivity[i]
                if job.val_indices is not None:
                    res.val_acc[rows] = self._accuracy(part.P, part.Bf, [job.val_indices[k] for k in idx], job.data)
        for res, sent, kept in zip(out, payloads, sensitivities):
            res.payloads = stack_payloads(sent)
            res.sensitivity = None if kept[0] is None else torch.stack(kept)
        return out

    def _train_chunk(self, parts: list[Part]) -> None:
        """Train one chunk: the clients of one or more runs, their parameters, buffers and momentum stacked as
        one [k, ...] tensor per parameter, each run's clients a contiguous block. Each part receives its
        clients' flat params [k, P], flat buffers [k, B], mean task losses [k], payloads, and its views of the
        stacked per-tensor parameters and buffers."""
        device = parts[0].job.global_params.device
        P = [ps[0] if len(parts) == 1 else torch.cat(ps) for ps in zip(*(part.initial_params(self._pshapes)
                                                                            for part in parts))]
        if self.channels_last:  # convolution weights laid out as their packed forward reads them
            P = [stacked_channels_last(p) if p.dim() == 5 else p for p in P]
        Bf = [bs[0] if len(parts) == 1 else torch.cat(bs) for bs in zip(*(self._initial_buffers(part) for part in parts))]
        offset = 0
        for part in parts:  # each run's SGD (its lr, momentum, kept state) on its block of the stacked tensors
            part.bind(P, Bf, offset, self._pshapes, self._btemplates)
            offset += len(part.clients)
        # several runs: each client's anchor (its run's global model) stacked like the weights, for steps that
        # take the rows of several runs at once; only objectives that add to the loss read it (a plain task loss:
        # copying the rows of every step's anchors was ~4% of a stacked digits group's training)
        read = any(part.job.trainer.objective.adds_to_loss for part in parts)
        anchors = [] if len(parts) == 1 or not read else [torch.cat(a) for a in zip(*(
            [a.expand(len(part.clients), *a.shape) for a in part.run.anchor] for part in parts))]
        self._stack = Stack(P, Bf, anchors)
        self._packed.train()
        for t in range(max(len(part.plan) for part in parts)):
            # one vmapped forward and backward per batch size and loss shared by the runs' clients at step t
            calls: dict[tuple, list[tuple[Part, int, object]]] = {}
            for part in parts:
                if t >= len(part.plan):
                    continue
                pad = self._pad and part.fills
                if pad:  # the clients still training: a prefix of the part's, all on batches of B
                    steps = [(part.plan.batch_size, slice(0, part.plan.active[t]))]
                else:
                    steps = part.plan.groups[t]
                for n, sel in steps:
                    calls.setdefault((n, part.loss_key, pad), []).append((part, n, sel))
            for (n, _, pad), group in sorted(calls.items(), key=lambda item: -item[0][0]):
                self._step(group, t, n, device, pad)
        self._stack = None
        for part in parts:
            part.finish()

    def _initial_buffers(self, part: Part) -> list[Tensor]:
        if part.starts is not None:  # each client's own (FedBN's local statistics)
            return [b.contiguous() for b in buffers_as(part.starts[1], self._btemplates)]
        return self._stacked_buffers(part.job.global_buffers, len(part.clients))

    def _step(self, group: list[tuple[Part, int, object]], t: int, n: int, device: torch.device, pad: bool) -> None:
        """One local step of the clients in `group` (parts with batches of n samples, one loss; `pad`: each
        client's batch filled up to n, its real samples counted)."""
        single = len(group) == 1
        if pad:  # (positions, real samples per client)
            picks = [part.plan.padded_picks(t) for part, _, _ in group]
            real = picks[0][1] if single else torch.cat([r for _, r in picks])
            picks = [(part.plan, flat) for (part, _, _), (flat, _) in zip(group, picks)]
        else:
            picks, real = [(part.plan, part.plan.picks(t, n, sel)) for part, _, sel in group], None
        x, y = gather(picks)  # one gather for the runs on one dataset
        x, y = x.view(-1, n, *x.shape[1:]), y.view(-1, n, *y.shape[1:])  # [g, n, ...]: one batch per client
        if single:
            part, _, sel = group[0]
            leaves = [p[sel].detach().requires_grad_() for p in part.P]
            buffers = [b[sel] for b in part.Bf]  # BatchNorm updates these in place
            run, own = part.run, client_rows(part.own, sel)
            stats_of, at = part.Bf, sel
        else:  # the group's rows of the chunk's stacks: views when they are one range
            stats_of, at = self._stack.buffers, chunk_rows(group, device)
            leaves = [p[at].detach().requires_grad_() for p in self._stack.params]
            buffers = [b[at] for b in self._stack.buffers]
            run, own = group_inputs(group, [a[at] for a in self._stack.anchors])  # none: no objective reads them
        self._trainer = trainer = group[0][0].job.trainer  # read by the vmapped loss; the group shares its loss
        # compiled for full batches of one run; the few partial ones run eagerly rather than compile their shapes
        fn = self._train_fn(run, own, several=not single,
                            compiled=self.compile and single and n == group[0][0].plan.batch_size)
        sizes = [count(sel, len(part.clients)) for part, _, sel in group]
        k = sum(sizes)
        params, stats = leaves, buffers
        if k == 1:  # batched kernels of one client run other code (a matmul of one: plain mm) that rounds
            # differently: computed as one of two (beside a detached copy), a client's arithmetic never depends on
            # whether others share its call
            params, stats, x, y = [twice(p) for p in leaves], [twice(b) for b in buffers], twice(x), twice(y)
            real = None if real is None else twice(real)
            own = map_tensors(twice, own)
            run = run if single else map_tensors(twice, run)
        with self._autocast(device):
            logits, task_logits, extra = fn(params, stats, x, y, run, own)
        task = trainer.stacked_task_losses(task_logits, y, real)
        tracking = group[0][0].tracker is not None  # the group shares it (loss_key)
        grads = torch.autograd.grad((task + extra)[:k].sum(), leaves, retain_graph=tracking)
        if tracking:  # the clients' sensitivity at this step's weights (fedagg/clients/sensitivity.py)
            sens = torch.autograd.grad(trainer.sensitivity.targets(logits, task, real)[:k].sum(), leaves)
        task = task[:k]
        if k == 1:
            real = None if real is None else real[:1]
            for b, doubled in zip(buffers, stats):  # BatchNorm updated the doubled copy; the client's is its first
                b.copy_(doubled[:1])
        seen = task.detach() * (n if real is None else real)  # each client's loss x its real samples
        if not isinstance(at, slice):  # gathered rows: write back the statistics BatchNorm updated in the copies
            for b, new in zip(stats_of, buffers):
                b[at] = new
        for i, (part, _, sel) in enumerate(group):
            lo, hi = sum(sizes[:i]), sum(sizes[:i + 1])
            if tracking:
                part.tracker.update([g[lo:hi] for g in sens] if not single else list(sens), sel)
            part.sgd.step([g[lo:hi] for g in grads] if not single else list(grads), sel)
            part.loss_sum[sel] += seen[lo:hi] if not single else seen

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
