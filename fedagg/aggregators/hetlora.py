"""HetLoRA (Cho et al., EMNLP 2024): clients of unequal ranks, their factors zero-padded to the largest rank and
averaged with sparsity weights p_k ∝ ‖B_k A_k‖_F, and rank self-pruning with a decay γ.

Follows the paper's equations: no code released by its authors was found (searched for HetLoRA's self-pruning
code in public repositories). Each client receives the global factors truncated to its current rank.
Self-pruning has a client half and a server half. Locally (`SelfPruning`, the default client half) a client of
rank r minimises its task loss plus the paper's regulariser λ ‖B_{k,γr:r}‖ ‖A_{k,γr:r}‖, B's columns and A's rows
from ⌊γr⌋ (at least one rank kept) to r, Frobenius norms, summed here over the adapted layers; it pushes the
tail ranks towards zero. After training, the tail ‖B_k[:, ⌊γr⌋:r] A_k[⌊γr⌋:r, :]‖_F over all layers is measured;
when it is smaller than the tail the client had the previous time it trained, its rank becomes ⌊γ r⌋ from its
next round on. `HetLoRAClient` as the client half drops the regulariser (λ = 0: pruning acts on the tails as
trained). The paper's value of λ was not at hand; 0.01 is ours. A client's current rank is per-client state
(`state_dict`), reported as `agg_mean_rank`.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor, nn

from fedagg.aggregators.adapter_rules import CombinedRule
from fedagg.aggregators.base import AggregateResult, measured
from fedagg.aggregators.inputs import Needs, RoundInputs
from fedagg.clients.objectives import Objective
from fedagg.config.constraints import Range, Tune, checked
from fedagg.models.adapters.layout import AdapterLayout
from fedagg.models.adapters.lora import LowRank


class HetLoRAClient(Objective):
    """Client half without the regulariser: a client starts from the global factors cut to its current (possibly
    pruned) rank."""

    personal = True

    def __init__(self) -> None:
        self.ranks: dict[int, int] = {}  # client id -> its rank after pruning (absent: its configured rank)
        self.a_rows: list[tuple[slice, int, int]] = []  # A's place in P, its padded rank R and width k
        self.b_cols: list[tuple[slice, int, int]] = []  # B's place in P, its height d and R
        self.configured: tuple[int, ...] = ()  # every client's rank by id, as the adapters were made
        self.factors: list[tuple[int, int]] = []  # per adapted layer: A's and B's index in the model's parameters
        self.decay = 0.99  # γ, the aggregator's (HetLoRA sets it)

    def setup(self, model: nn.Module) -> None:
        places, offset = {}, 0
        for p in model.parameters():
            places[id(p)] = slice(offset, offset + p.numel())
            offset += p.numel()
        lows = [m for m in model.modules() if isinstance(m, LowRank)]
        if not lows:
            raise ValueError("aggregator=hetlora combines low-rank adapters, but the model has none; set adapter=lora")
        self.a_rows = [(places[id(m.A)], *m.A.shape) for m in lows]
        self.b_cols = [(places[id(m.B)], *m.B.shape) for m in lows]
        index = {id(p): i for i, p in enumerate(model.parameters())}
        self.factors = [(index[id(m.A)], index[id(m.B)]) for m in lows]
        self.configured = lows[0].client_ranks

    def rank_of(self, client_id: int) -> int:
        """Its current rank: pruned, else as configured."""
        return self.ranks.get(client_id, self.configured[client_id])

    def start(self, client_id: int, params: Tensor, buffers: Tensor) -> tuple[Tensor, Tensor]:
        rank = self.ranks.get(client_id)
        if rank is None:
            return params, buffers
        params = params.clone()
        for place, _, k in self.a_rows:
            params[place].view(-1, k)[rank:] = 0
        for place, d, _ in self.b_cols:
            params[place].view(d, -1)[:, rank:] = 0
        return params, buffers

    def state_dict(self) -> dict:
        return {"ranks": dict(self.ranks)}

    def load_state_dict(self, state: dict) -> None:
        self.ranks = {int(k): int(v) for k, v in state["ranks"].items()}


def kept_rank(decay: float, rank: int) -> int:
    """⌊γ r⌋, at least one: the rank a client keeps when its tail is pruned."""
    return max(1, math.floor(decay * rank))


class SelfPruning(HetLoRAClient):
    """The client half with the paper's local regulariser λ Σ_layers ‖B[:, ⌊γr⌋:r]‖_F ‖A[⌊γr⌋:r, :]‖_F on the
    client's current rank r (none when ⌊γr⌋ = r). The tail is the client's state: a [P] mask of its entries."""

    @checked("aggregator.client.")
    def __init__(self, strength: Annotated[float, Range(gt=0, finite=True, words="it must be > 0; "
                                                        "client._target_=fedagg.aggregators.hetlora.HetLoRAClient "
                                                        "drops the regulariser"),
                                          Tune(1e-4, 1e-1, log=True, source="no value of the paper at hand: "
                                                                            "1e-4 to 0.1 around 0.01")] = 0.01) -> None:
        super().__init__()
        self.strength = float(strength)
        self.masks: dict[int, Tensor] = {}  # rank -> its tail mask [P], made once

    def client_state(self, client_id: int, like: Tensor) -> Tensor:
        rank = self.rank_of(client_id)
        if rank not in self.masks:
            mask, keep = torch.zeros_like(like), kept_rank(self.decay, rank)
            for place, _, k in self.a_rows:
                mask[place].view(-1, k)[keep:rank] = 1
            for place, d, _ in self.b_cols:
                mask[place].view(d, -1)[:, keep:rank] = 1
            self.masks[rank] = mask
        return self.masks[rank].to(like)

    def penalty(self, params: list[Tensor], anchor: list[Tensor], state: list[Tensor] | None) -> Tensor:
        total = sum(torch.linalg.vector_norm(params[b] * state[b]) * torch.linalg.vector_norm(params[a] * state[a])
                    for a, b in self.factors)
        return self.strength * total


def tail_norm(layout: AdapterLayout, flat: Tensor, keep: int, rank: int) -> float:
    """‖B[:, keep:rank] A[keep:rank, :]‖_F over all adapted layers of one client's factors `flat` [P]."""
    total = flat.new_zeros(())
    for pair in layout.pairs:
        b, a = layout.b(flat, pair)[:, keep:rank], layout.a(flat, pair)[keep:rank]
        total += (b @ a).square().sum()
    return float(total.sqrt())


class HetLoRA(CombinedRule):
    """`conf/aggregator/hetlora.yaml`: zero-padded factors, sparsity-weighted, with rank self-pruning."""

    @checked("aggregator.")
    def __init__(self, decay: Annotated[float, Range(gt=0, le=1)] = 0.99, client: HetLoRAClient | None = None) -> None:
        super().__init__("samples")
        self.decay = decay
        self.client = SelfPruning() if client is None else client
        self.client.decay = decay  # the tail its regulariser pushes down is the one pruning measures
        self.needs = Needs(adapters=True, client_half=self.client)
        self.tails: dict[int, float] = {}  # client id -> its tail norm the last time it trained

    def client_weights(self, inputs: RoundInputs) -> Tensor:
        """p_k ∝ ‖B_k A_k‖_F (all layers); uniform while every product is zero, or when one is not finite (the
        round then diverges, and the weights stay a distribution)."""
        layout = inputs.layout.adapters
        norms = sum(layout.products(inputs.client_params, pair, inputs.base).square().sum((-2, -1))
                    for pair in layout.pairs).sqrt()
        if not bool((norms > 0).any()) or not bool(torch.isfinite(norms.sum())):
            return torch.full_like(norms, 1.0 / norms.numel())
        return norms / norms.sum()

    def client_rank(self, adapters: AdapterLayout, client: int) -> int:
        return self.client.ranks.get(client, adapters.client_ranks[client])  # pruned, else configured

    def combine(self, inputs: RoundInputs) -> AggregateResult:
        weights, metrics = measured(self.client_weights(inputs))
        weights = weights.to(inputs.client_params.dtype)
        layout = inputs.layout.adapters
        ranks = self.ranks(inputs)
        for k, (cid, rank) in enumerate(zip(inputs.client_ids.tolist(), ranks)):
            keep = kept_rank(self.decay, rank)
            if keep == rank:
                continue
            tail = tail_norm(layout, inputs.client_params[k], keep, rank)
            if cid in self.tails and tail < self.tails[cid]:
                self.client.ranks[cid] = keep  # from its next round on; its next tail is measured afresh
                del self.tails[cid]
            else:
                self.tails[cid] = tail
        pruned = self.ranks(inputs)
        return AggregateResult(weights @ inputs.client_params, weights,
                               metrics={**metrics, "mean_rank": sum(pruned) / len(pruned)})

    def state_dict(self) -> dict:
        return {"tails": dict(self.tails), "client": self.client.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.tails = {int(k): float(v) for k, v in state["tails"].items()}
        self.client.load_state_dict(state["client"])
