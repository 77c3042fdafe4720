"""FLoRA (Wang et al., NeurIPS 2024): stack the clients' factors, B = [p_1 B_1, …, p_K B_K], A = [A_1; …; A_K], so
that B A = Σ p_k B_k A_k exactly; the server merges s B A into the frozen base and every client starts the next
round from fresh adapters (A drawn anew, B zero) of its own rank.

Released code: ATP-1010/FederatedLLM@7bea158: fed_utils/model_aggregation.py:77-91 stacks the factors,
scaling A_k by p_k (p_k = n_k / Σ n_j, l. 11-14) where the paper scales B_k (the product is the same), and
main.py:390-391 merges the stacked adapter into the base (`merge_and_unload`); a new PEFT adapter is then
built for the next round. Here the merge is the base update s Σ p_k B_k A_k (`AggregateResult.base_update`)
and the fresh A comes from the run's own stream (seed, "flora_adapters", round), so a resumed or repeated run
draws the same. Every participant downloads the stacked factors, Σ_j r_j (d + k) values per layer, to merge
them into its copy of the base (`agg_bits_down`).
"""

from __future__ import annotations

import torch

from fedagg.aggregators.adapter_rules import CombinedRule, base_increment, exact_products, mean_rank
from fedagg.aggregators.base import AggregateResult, measured
from fedagg.aggregators.inputs import RoundInputs
from fedagg.models.adapters.layout import AdapterLayout, sent_values
from fedagg.models.adapters.lora import initial_a
from fedagg.seeding import generator


class FLoRA(CombinedRule):
    """`conf/aggregator/flora.yaml`: exact aggregation by stacking; the base absorbs the product each round."""

    def combine(self, inputs: RoundInputs) -> AggregateResult:
        weights, metrics = measured(self.client_weights(inputs))
        weights = weights.to(inputs.client_params.dtype)
        layout = inputs.layout.adapters
        merged = base_increment(inputs, exact_products(inputs, weights))
        fresh = inputs.global_params.new_zeros(layout.num_params)  # B = 0
        gen = generator(inputs.seed, "flora_adapters", inputs.round)
        for pair in layout.pairs:
            fresh[pair.a] = initial_a(layout.rank, pair.k, gen).reshape(-1).to(fresh)
        return AggregateResult(fresh, weights, metrics=metrics, base_update=merged)

    def effective_rank(self, inputs: RoundInputs, weights: torch.Tensor, params: torch.Tensor) -> float:
        """The merged product's rank (the new adapters are zero)."""
        return mean_rank(exact_products(inputs, weights))

    def down_values(self, layout: AdapterLayout, rank: int, ranks: list[int]) -> int:
        return sum(sent_values(layout, r) for r in ranks)  # every participant's factors, stacked
