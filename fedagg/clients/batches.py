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
from fedagg.data.device import apply_crop_flip, draw_crop_flip, targets
from fedagg.data.seeding import generator

Selection = slice | Tensor  # chunk positions of a group of clients: a range, or an index tensor


def num_steps(num_samples: int, batch_size: int, epochs: int) -> int:
    return epochs * -(-num_samples // batch_size)


class BatchPlan:
    def __init__(self, clients: list[ClientData], data, *, batch_size: int, epochs: int, seed: int, round: int,
                 budgets: list[int] | None = None) -> None:
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
        for client, n in zip(clients, sizes):
            g = generator(seed, "batches", client.id, round, device=data.device)
            dev = client.train_idx.device
            for _ in range(epochs):
                order.append(client.train_idx[torch.randperm(n, generator=g, device=dev)])
                if data.augment:  # one draw per batch, as DeviceData.train_batch makes it
                    crops += [draw_crop_flip(len(b), g, data.device) for b in torch.arange(n).split(batch_size)]
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

    def batch(self, t: int, n: int, clients: Selection) -> tuple[Tensor, Tensor]:
        """Inputs [g * n, ...] and labels [g * n] of step t for a group of g clients whose batches hold n samples,
        client after client, as `data.prepare` returns them (a view to [g, n, ...] can change the strides of a
        size-1 channel axis, and with them which convolution kernel runs)."""
        return self._gather(self.pos[t, clients, :n].reshape(-1))

    def padded_batch(self, t: int) -> tuple[Tensor, Tensor, Tensor]:
        """Inputs [m * B, ...], labels [m * B] and real samples [m] of step t for the m clients still training:
        each client's batch filled up to B samples with its first sample of the round (real data, so the
        forward stays finite; the loss weighs it zero)."""
        m = self.active[t]
        x, y = self._gather(self.pos[t, :m].reshape(-1))
        return x, y, self.counts[t, :m]

    def _gather(self, flat: Tensor) -> tuple[Tensor, Tensor]:
        idx = self.order[flat]
        x = self.data.train_images(idx)
        if self.crops is not None:
            x = apply_crop_flip(x, *(c[flat] for c in self.crops))
        x = self.data.prepare(x)
        y = targets(self.data, "train", idx)
        return x, y
