"""What the rules on low-rank adapters (`adapter=lora`) share: the declaration, the round's records, factor helpers.

A rule reads where each layer's A and B sit, the padded rank R, the scale s and every client's rank from
`inputs.layout.adapters` (fedagg.models.adapters.layout), and a frozen A from `inputs.base` (FFA-LoRA). What
it adds to the base it returns in `AggregateResult.base_update` [Q]; the round applies it.

Every such rule records, per round (`agg_<name>` columns of metrics.csv):
- `error`: the aggregation error ‖Σ p_k B_k A_k − (Σ p_k B_k)(Σ p_k A_k)‖_F / ‖Σ p_k B_k A_k‖_F over all adapted
  layers, of the factors the participants uploaded and the weights the rule used;
- `effective_rank`: the numerical rank of the ΔW the round produced, averaged over the layers;
- `bits_up`, `bits_down`: what the rule sends, at each participant's own rank (r (d + k) 32-bit values per layer
  each way, and what the rule adds: FLoRA's stacked factors, FedEx-LoRA's full-rank residual), of the factors
  alone; the loop's `bits_up`/`bits_down` columns count the same values (`adapter_values`) as the channel
  sends them (compressed), with the buffers, down to every sampled client.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor, nn

from fedagg.aggregators.base import AggregateResult, Aggregator, measured
from fedagg.aggregators.inputs import Needs, RoundInputs
from fedagg.models.adapters.layout import AdapterLayout, aggregation_error, sent_values, weighted_products
from fedagg.models.adapters.lora import LowRank


class AdapterRule(Aggregator):
    """FedAvg on the adapters' factors (FedIT): the base aggregate, so that a channel stage acting on the weighted
    mean (DP's noise) applies as it does to FedAvg; its server step records the adapter diagnostics."""

    needs = Needs(adapters=True)
    weighted_mean = True  # FedIT's, FFA-LoRA's and FedSA-LoRA's factors are the weighted mean of the uploads

    def server_update(self, inputs: RoundInputs, update: Tensor) -> tuple[Tensor, dict[str, float]]:
        params = inputs.global_params + update
        weights, _ = measured(self.client_weights(inputs))  # the weights the mean was made with
        return params, self.records(inputs, weights.to(inputs.client_params.dtype), params)

    def records(self, inputs: RoundInputs, weights: Tensor, params: Tensor) -> dict[str, float]:
        """The round's adapter diagnostics (see the module) for the uploads, `weights` [K] and new `params` [P]."""
        layout = inputs.layout.adapters
        ranks = self.ranks(inputs)
        return {
            "error": aggregation_error(layout, inputs.client_params, weights, inputs.base),
            "effective_rank": self.effective_rank(inputs, weights, params),
            "bits_up": sum(self.up_values(layout, r) for r in ranks) * 32,
            "bits_down": sum(self.down_values(layout, r, ranks) for r in ranks) * 32,
        }

    def ranks(self, inputs: RoundInputs) -> list[int]:
        """Each participant's rank this round."""
        return [self.client_rank(inputs.layout.adapters, i) for i in inputs.client_ids.tolist()]

    def adapter_values(self, adapters: AdapterLayout, client: int, reported: Sequence[int]) -> tuple[int, int]:
        rank = self.client_rank(adapters, client)
        ranks = [self.client_rank(adapters, i) for i in reported]
        return self.down_values(adapters, rank, ranks), self.up_values(adapters, rank)

    def up_values(self, layout: AdapterLayout, rank: int) -> int:
        """Values one participant of rank `rank` uploads: its trained factors."""
        return sent_values(layout, rank)

    def down_values(self, layout: AdapterLayout, rank: int, ranks: list[int]) -> int:
        """Values one participant of rank `rank` receives (`ranks`: the round's participants')."""
        return sent_values(layout, rank)

    def effective_rank(self, inputs: RoundInputs, weights: Tensor, params: Tensor) -> float:
        """Numerical rank of the new global B A, averaged over the adapted layers."""
        layout = inputs.layout.adapters
        return mean_rank([layout.products(params, pair, inputs.base) for pair in layout.pairs])


def mean_rank(matrices: list[Tensor]) -> float:
    """The numerical ranks' mean; NaN when a matrix is not finite (a diverged round: the run says so)."""
    if not all(bool(torch.isfinite(m).all()) for m in matrices):
        return float("nan")
    return sum(int(torch.linalg.matrix_rank(m)) for m in matrices) / len(matrices)


class CombinedRule(AdapterRule):
    """A rule on adapters whose new model is not a server step on the weighted mean (FLoRA's merge, FlexLoRA's
    SVD): it overrides `combine`, and its aggregate adds the adapter diagnostics."""

    weighted_mean = False

    def combine(self, inputs: RoundInputs) -> AggregateResult:
        raise NotImplementedError

    def aggregate(self, inputs: RoundInputs) -> AggregateResult:
        out = self.combine(inputs)
        records = self.records(inputs, out.weights.to(inputs.client_params.dtype), out.params)
        return replace(out, metrics={**out.metrics, **records})


def exact_products(inputs: RoundInputs, weights: Tensor) -> list[Tensor]:
    """Σ_k p_k B_k A_k [d, k] for every adapted layer (without the scale s)."""
    layout = inputs.layout.adapters
    return [weighted_products(layout, inputs.client_params, weights, pair, inputs.base) for pair in layout.pairs]


def base_increment(inputs: RoundInputs, products: list[Tensor]) -> Tensor:
    """[Q] the base update that adds s · products[l] to each adapted layer's weight (zero elsewhere)."""
    layout = inputs.layout.adapters
    update = inputs.global_params.new_zeros(layout.base_size)
    for pair, product in zip(layout.pairs, products):
        update[pair.base] = (layout.scale * product).reshape(-1).to(update.dtype)
    return update


def factor_mask(model: nn.Module, factor: str) -> Tensor:
    """[P] bool: the entries of the flat parameters that are the adapters' `factor` ("A" or "B")."""
    chosen = {id(getattr(m, factor)) for m in model.modules() if isinstance(m, LowRank)}
    parts = [torch.full((p.numel(),), id(p) in chosen, dtype=torch.bool) for p in model.parameters()]
    return torch.cat(parts).to(next(model.parameters()).device)


def rank_cut(layout: AdapterLayout, params: Tensor, rank: int) -> Tensor:
    """`params` [P] with every factor beyond rank `rank` set to zero (what a client of that rank starts from)."""
    return torch.where(layout.rank_mask(rank, params.device), params, torch.zeros((), dtype=params.dtype,
                                                                                  device=params.device))
