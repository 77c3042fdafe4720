"""FedIT (Zhang et al., ICASSP 2024): FedAvg on the adapters' factors, A ← Σ p_k A_k, B ← Σ p_k B_k (inexact:
(Σ p_k B_k)(Σ p_k A_k) ≠ Σ p_k B_k A_k; `agg_error` measures by how much).

Released code: JayZhang42/FederatedGPT-Shepherd@90d8aa6:fed_utils/model_aggregation.py:10-27, p_k = n_k / Σ n_j
over the round's clients on every adapter tensor (`weighting: samples`, the default). Clients of unequal ranks
upload factors zero-padded to the largest rank (the code has one rank), so the average is the zero-padded one.
"""

from __future__ import annotations

from fedagg.aggregators.adapter_rules import AdapterRule


class FedIT(AdapterRule):
    """`conf/aggregator/fedit.yaml`: the base rule on adapters is already FedIT."""
