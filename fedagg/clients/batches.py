"""The batch order of local training, for every engine: drawn ahead, served step by step.

Each client draws from its own stream `generator(seed, "batches", id, round)`: one
permutation of its samples per local epoch, then (when the data is augmented) each of that
epoch's batches' crop and flip values, so a client's batches never depend on which other
clients train with it or on the engine. Step t is served as one gather per group of
clients whose batch has the same size: clients are ordered by their number of steps (most first), so the
clients still training at step t are a prefix, those with a full batch are usually all of
it, and a client's partial last batch (of n samples) comes in a group of its own size n.
A model whose samples do not interact within a batch (no BatchNorm) can instead take the
whole prefix in one call (`padded_batch`): a partial batch filled up with a real sample of
the client's own, which its loss then weighs zero.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedagg.clients.client import ClientData
from fedagg.data.device import apply_crop_flip, crop_geometry, draw_crop_flip, inputs_key, labels_key, targets
from fedagg.seeding import generator

Selection = slice | Tensor  # chunk positions of a group of clients: a range, or an index tensor


def num_steps(num_samples: int, batch_size: int, epochs: int) -> int:
    return epochs * -(-num_samples // batch_size)


class BatchPlan:
    def __init__(self, clients: list[ClientData], data, *, batch_size: int, epochs: int, seed: int,
                 round: int | list[int], budgets: list[int] | None = None) -> None:
        """`clients` must be ordered by the steps they take, most first; a client with a budget stops after
        that many steps (its batches are drawn as for a full round, so a budget only cuts it short)."""
        self.data, self.batch_size = data, batch_size
        sizes = [c.num_samples for c in clients]
        self.steps = [num_steps(n, batch_size, epochs) for n in sizes]
        if budgets is not None:
            self.steps = [min(full, budget) for full, budget in zip(self.steps, budgets)]
        if any(a < b for a, b in zip(self.steps, self.steps[1:])):
            raise ValueError("BatchPlan needs clients ordered by their number of steps, most first")
        order, crops = [], []
        span = crop_geometry(data)[2] if data.augment else 0
        draws = round if isinstance(round, list) else [round] * len(clients)  # each client's stream, or the round's
        for client, n, draw in zip(clients, sizes, draws):
            g = generator(seed, "batches", client.id, draw, device=data.device)
            dev = client.train_idx.device
            for _ in range(epochs):
                order.append(client.train_idx[torch.randperm(n, generator=g, device=dev)])
                if data.augment:  # one draw per batch, as DeviceData.train_batch makes it
                    crops += [draw_crop_flip(len(b), g, data.device, span) for b in torch.arange(n).split(batch_size)]
        self.order = torch.cat(order).to(data.device)  # training-pool index of every sample served, client by client
        self.crops = None
        if crops:
            oy, ox, flip = zip(*crops)
            self.crops = (torch.cat(oy), torch.cat(ox), torch.cat(flip))
        # position in `order` of the i-th sample of client k's batch at step t: [T, K, B]
        n_k = torch.tensor(sizes).view(1, -1, 1)
        batches_k = -(-n_k // batch_size)
        offset_k = torch.tensor([0] + sizes[:-1]).cumsum(0).view(1, -1, 1) * epochs
        t = torch.arange(self.steps[0] if self.steps else 0).view(-1, 1, 1)
        local = (t % batches_k) * batch_size + torch.arange(batch_size).view(1, 1, -1)
        valid = (local < n_k) & (t < torch.tensor(self.steps).view(1, -1, 1))
        self.pos = torch.where(valid, offset_k + (t // batches_k) * n_k + local, offset_k).to(data.device)
        counts = valid.sum(2)  # [T, K]: samples in each client's batch (0 once it is done)
        self.counts = counts.to(data.device)
        self.active: list[int] = (counts > 0).sum(1).tolist()  # [T]: clients still training at step t (a prefix)
        self.seen: list[int] = counts.sum(0).tolist()  # samples each client trains on this round
        self.groups: list[list[tuple[int, Selection]]] = [self._group(row) for row in counts.tolist()]

    def _group(self, counts: list[int]) -> list[tuple[int, Selection]]:
        """(batch size n, clients with n samples this step), the largest n first. In plain Python: a
        step's handful of counts costs less so than as tensor calls, which every step would pay."""
        groups = []
        for n in sorted({c for c in counts if c > 0}, reverse=True):
            members = [k for k, c in enumerate(counts) if c == n]
            lo, hi = members[0], members[-1] + 1
            contiguous = hi - lo == len(members)
            groups.append((n, slice(lo, hi) if contiguous else torch.tensor(members, device=self.data.device)))
        return groups

    def __len__(self) -> int:
        return len(self.groups)

    def picks(self, t: int, n: int, clients: Selection) -> Tensor:
        """Positions in the round's draws [g * n] of step t's samples for a group of g clients whose batches
        hold n samples, client after client (`gather` turns them into a batch)."""
        return self.pos[t, clients, :n].reshape(-1)

    def padded_picks(self, t: int) -> tuple[Tensor, Tensor]:
        """Positions [m * B] of step t's samples for the m clients still training, each client's batch filled up
        to B samples with its first sample of the round (real data, so the forward stays finite; the loss weighs
        it zero), and the real samples of each [m]."""
        m = self.active[t]
        return self.pos[t, :m].reshape(-1), self.counts[t, :m]

    def batch(self, t: int, n: int, clients: Selection) -> tuple[Tensor, Tensor]:
        """Inputs [g * n, ...] and labels [g * n] of `picks(t, n, clients)`, as `data.prepare` returns them (a
        view to [g, n, ...] can change the strides of a size-1 channel axis, and with them which convolution
        kernel runs)."""
        return gather([(self, self.picks(t, n, clients))])

    def padded_batch(self, t: int) -> tuple[Tensor, Tensor, Tensor]:
        """Inputs [m * B, ...], labels [m * B] and real samples [m] of `padded_picks(t)`."""
        flat, real = self.padded_picks(t)
        return *gather([(self, flat)]), real


def gather(picks: list[tuple[BatchPlan, Tensor]]) -> tuple[Tensor, Tensor]:
    """The inputs and labels of several plans' picks, one after another. Plans on data that give an index the
    same input (the runs of a stacked sweep on one dataset: `inputs_key`) are served by one gather and one
    preparation; the preparation is per sample, so a sample comes out the same whichever others share it."""
    idx = [plan.order[flat] for plan, flat in picks]
    xs, ys = [], []
    for members in _runs(picks, lambda plan: inputs_key(plan.data)):
        data = picks[members[0]][0].data
        x = data.train_images(_cat([idx[i] for i in members]))
        # each plan's crop and flip values at its positions (augmented data; a plan of no samples has none)
        drawn = [[c[flat] for c in plan.crops] for plan, flat in (picks[i] for i in members) if plan.crops is not None]
        if drawn:
            padding, size, _ = crop_geometry(data)
            x = apply_crop_flip(x, *(_cat(list(values)) for values in zip(*drawn)), padding=padding, size=size)
        xs.append(data.prepare(x))
    for members in _runs(picks, lambda plan: labels_key(plan.data)):
        ys.append(targets(picks[members[0]][0].data, "train", _cat([idx[i] for i in members])))
    return _cat(xs), _cat(ys)


def _runs(picks: list[tuple[BatchPlan, Tensor]], key) -> list[list[int]]:
    """Positions of `picks` in runs of consecutive ones with equal keys."""
    runs, last = [], object()
    for i, (plan, _) in enumerate(picks):
        k = key(plan)
        if runs and k == last:
            runs[-1].append(i)
        else:
            runs.append([i])
        last = k
    return runs


def _cat(tensors: list[Tensor]) -> Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)
