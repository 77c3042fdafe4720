"""FedEx-LoRA (Singhal et al., ACL 2025): A and B averaged as in FedIT, and the residual
s (Σ p_k B_k A_k − (Σ p_k B_k)(Σ p_k A_k)) added to the frozen base, so that the new model is exactly the
average of the clients' models.

Released code: RaghavSinghal10/fedex-lora@683a3f3:fed_agg.py:86-114 (per adapted layer: M = mean_k B_k A_k,
residue = M − mean B · mean A, base += scaling · residueᵀ; the transpose is for its GPT-2 Conv1D layers). The
code averages uniformly over the round's clients; here `weighting: samples` is the default (the paper's
p_k = n_k / n) and `weighting: uniform` the code's. The code also averages the classification head, which here
is frozen with the base. The residual is full rank: every participant downloads it, d k values per layer, besides
the averaged factors at its rank (`agg_bits_down`).
"""

from __future__ import annotations

from fedagg.aggregators.adapter_rules import CombinedRule, base_increment, exact_products
from fedagg.aggregators.base import AggregateResult, measured
from fedagg.aggregators.inputs import RoundInputs
from fedagg.models.adapters.layout import AdapterLayout, sent_values


class FedExLoRA(CombinedRule):
    """`conf/aggregator/fedex_lora.yaml`: FedIT plus the residual into the base (exact)."""

    def combine(self, inputs: RoundInputs) -> AggregateResult:
        weights, metrics = measured(self.client_weights(inputs))
        weights = weights.to(inputs.client_params.dtype)
        layout = inputs.layout.adapters
        mean = weights @ inputs.client_params
        residual = [exact - layout.products(mean, pair, inputs.base)
                    for pair, exact in zip(layout.pairs, exact_products(inputs, weights))]
        return AggregateResult(mean, weights, metrics=metrics, base_update=base_increment(inputs, residual))

    def down_values(self, layout: AdapterLayout, rank: int, ranks: list[int]) -> int:
        return sent_values(layout, rank) + sum(pair.d * pair.k for pair in layout.pairs)
