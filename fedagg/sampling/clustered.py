"""`sampler=clustered` (Fraboni, Vidal, Kameni, Lorenzi, ICML 2021, "Clustered sampling", Algorithm 1).

The clients' shares p_i = n_i / Σ n, each times k, are laid end to end from the largest down; the line [0, k) is
cut into k unit intervals, and interval j is a distribution over the clients whose mass falls in it. One client is
drawn from each of the k distributions. Each client is still drawn p_i k times in expectation, as with k draws ∝
n_i (multinomial "MD" sampling), but from k different groups, so large clients are almost surely in every round
and the mix of clients varies less between rounds: the paper proves a smaller variance of the aggregate. Why this
rule: it needs nothing but the clients' sizes (no model scores, no extra training), it is unbiased, and the authors'
code is public.

A client drawn by two distributions (its mass spans both) trains once; the authors train it once per draw and
average all k models with 1/k (FedProx.py:402-430 at the same commit): here the aggregator weighs the clients that
trained, so a step may train fewer than k clients.

Authors' code: Accenture/Labs-Federated-Learning@47c17fe3127add058f3a47115163db962cf1564a:py_func/clustering.py:11-42
(`get_clusters_with_alg1`, in integers scaled by 1e10) and :213-223 (`sample_clients`: one draw per cluster).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedagg.seeding import generator
from fedagg.sampling.base import Draw, Sampler


def clusters(sizes: Tensor, k: int) -> Tensor:
    """[k, M] float64, rows summing to 1: Algorithm 1's distributions for clients of sizes [M]. In integers: client
    i's mass is k n_i and each interval holds Σ n, so nothing is rounded. Clients are laid down largest first, ties
    in reverse index order (numpy's flip of a stable argsort; the authors' code leaves the order of equal sizes to
    numpy's sort, which may differ by machine)."""
    sizes = sizes.long().cpu()
    total = int(sizes.sum())
    order = torch.argsort(sizes, stable=True).flip(0)
    end = torch.cumsum(k * sizes[order], 0)
    start = end - k * sizes[order]
    bounds = torch.arange(k + 1) * total  # interval j: [j Σn, (j+1) Σn)
    overlap = (torch.minimum(end.view(1, -1), bounds[1:].view(-1, 1))
               - torch.maximum(start.view(1, -1), bounds[:-1].view(-1, 1))).clamp(min=0)
    mass = torch.zeros(k, len(sizes), dtype=torch.long)
    mass[:, order] = overlap
    return mass.double() / total


class Clustered(Sampler):
    equal_chance = False
    shown = "sampler=clustered"

    def select(self, k: int, pool: Tensor, step: int, draw: Draw) -> Tensor:
        sizes = draw.sizes[pool]
        if int(sizes.sum()) == 0:  # nobody holds data: nothing to weigh the draw by
            return super().select(k, pool, step, draw)
        drawn = torch.multinomial(clusters(sizes, k), 1, generator=generator(draw.seed, draw.stream, step)).view(-1)
        return pool[drawn.unique()]
