"""Where the adapters sit in the flat parameter vector, and the factor algebra the adapter rules share.

A flat adapter vector [..., P] holds, per adapted layer, A [R, k] and B [d, R] (R: the largest client rank;
a client of rank r uses the first r rows of A and columns of B, the rest stay zero) with ΔW = s B A,
s = α / rank. The frozen base is a second flat vector [Q] (`FrozenBase`); `Pair.base` is where the layer's
weight sits in it, so a rule that changes the base (FLoRA, FedEx-LoRA) says by how much as a [Q] vector.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Pair:
    """One adapted layer: its factors' places in the flat adapter vector and its weight's in the base vector."""

    name: str  # the adapted module's name in the model (e.g. "net.1")
    a: slice | None  # A [R, k] in P; None: A is frozen (part of the base: FFA-LoRA)
    b: slice  # B [d, R] in P
    a_base: slice | None  # A in the base vector when frozen
    base: slice  # the layer's weight in the base vector (d * k values, viewed [d, k])
    d: int
    k: int
    weight_shape: tuple[int, ...]  # the weight's own shape (a convolution's [out, in, kh, kw])


@dataclass(frozen=True)
class AdapterLayout:
    """The adapters of a model: layer pairs, the padded rank R, the scale s, and every client's rank by id."""

    pairs: tuple[Pair, ...]
    rank: int  # R: the largest client rank, the factors' padded size
    scale: float  # s = α / rank
    client_ranks: tuple[int, ...]  # by client id
    num_params: int  # P
    base_size: int  # Q

    def a(self, flat: Tensor, pair: Pair, base: Tensor | None = None) -> Tensor:
        """A [..., R, k] of `flat` [..., P] (or of `base` [Q] when A is frozen)."""
        if pair.a is None:
            return base[pair.a_base].view(self.rank, pair.k)
        return flat[..., pair.a].unflatten(-1, (self.rank, pair.k))

    def b(self, flat: Tensor, pair: Pair) -> Tensor:
        """B [..., d, R] of `flat` [..., P]."""
        return flat[..., pair.b].unflatten(-1, (pair.d, self.rank))

    def products(self, flat: Tensor, pair: Pair, base: Tensor | None = None) -> Tensor:
        """B A [..., d, k] (without the scale s)."""
        return self.b(flat, pair) @ self.a(flat, pair, base)

    def rank_mask(self, rank: int, device=None) -> Tensor:
        """[P] bool: the entries a client of rank `rank` trains (its first `rank` rows of A, columns of B)."""
        mask = torch.zeros(self.num_params, dtype=torch.bool, device=device)
        for pair in self.pairs:
            if pair.a is not None:
                mask[pair.a] = (torch.arange(self.rank, device=device) < rank).repeat_interleave(pair.k)
            mask[pair.b] = (torch.arange(self.rank, device=device) < rank).repeat(pair.d)
        return mask

    def ranks_of(self, client_ids: Tensor) -> list[int]:
        return [self.client_ranks[i] for i in client_ids.tolist()]


def aggregation_error(layout: AdapterLayout, clients: Tensor, weights: Tensor, base: Tensor | None = None) -> float:
    """‖Σ p_k B_k A_k − (Σ p_k B_k)(Σ p_k A_k)‖_F / ‖Σ p_k B_k A_k‖_F over all adapted layers together; 0 when the
    exact product is 0 (nothing trained)."""
    wrong, exact = clients.new_zeros(()), clients.new_zeros(())
    mean = weights @ clients
    for pair in layout.pairs:
        ideal = weighted_products(layout, clients, weights, pair, base)
        wrong += (ideal - layout.products(mean, pair, base)).square().sum()
        exact += ideal.square().sum()
    return float((wrong.sqrt() / exact.sqrt()) if exact > 0 else 0.0)


def effective_rank(layout: AdapterLayout, flat: Tensor, base: Tensor | None = None) -> float:
    """The numerical rank of the global ΔW = s B A, averaged over the adapted layers (torch's default tolerance)."""
    ranks = [int(torch.linalg.matrix_rank(layout.products(flat, pair, base))) for pair in layout.pairs]
    return sum(ranks) / len(ranks)


def weighted_products(layout: AdapterLayout, clients: Tensor, weights: Tensor, pair: Pair,
                      base: Tensor | None = None) -> Tensor:
    """Σ_k p_k B_k A_k [d, k] for one layer."""
    return torch.einsum("k,kij->ij", weights, layout.products(clients, pair, base))


def sent_values(layout: AdapterLayout, rank: int, frozen_a: bool = False) -> int:
    """How many values the factors of rank `rank` hold: r (d + k) per layer (r d when A is frozen)."""
    return sum(rank * (pair.d + (0 if frozen_a or pair.a is None else pair.k)) for pair in layout.pairs)
