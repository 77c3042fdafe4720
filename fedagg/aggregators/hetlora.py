"""HetLoRA (Cho et al., EMNLP 2024): clients of unequal ranks, their factors zero-padded to the largest rank and
averaged with sparsity weights p_k ∝ ‖B_k A_k‖_F, and rank self-pruning with a decay γ.

Follows the paper's equations (no released code was found). Each client receives the global factors truncated
to its current rank. Self-pruning: after a client trains at rank r, the tail of its factors past ⌊γ r⌋ (at least
one rank kept) is measured, ‖B_k[:, ⌊γr⌋:r] A_k[⌊γr⌋:r, :]‖_F over all layers; when it is smaller than the tail
the client had the previous time it trained, its rank becomes ⌊γ r⌋ from its next round on. The paper's local
regulariser that pushes the tail down (λ ‖B_tail‖ ‖A_tail‖) is not added (λ = 0 here): pruning acts on the
tails as trained. A client's current rank is per-client state (`state_dict`), reported as `agg_mean_rank`.
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
from fedagg.config.constraints import Range, checked
from fedagg.models.adapters.layout import AdapterLayout
from fedagg.models.adapters.lora import LowRank


class HetLoRAClient(Objective):
    """Client half: a client starts from the global factors cut to its current (possibly pruned) rank."""

    personal = True

    def __init__(self) -> None:
        self.ranks: dict[int, int] = {}  # client id -> its rank after pruning (absent: its configured rank)
        self.a_rows: list[tuple[slice, int, int]] = []  # A's place in P, its padded rank R and width k
        self.b_cols: list[tuple[slice, int, int]] = []  # B's place in P, its height d and R

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
        self.client = HetLoRAClient() if client is None else client
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
            keep = max(1, math.floor(self.decay * rank))
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
