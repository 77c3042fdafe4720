"""FlexLoRA (Bai et al., NeurIPS 2024): ΔW = Σ p_k B_k A_k at full size, then each client receives the
truncated SVD of ΔW at its own rank r_k (B_k = U_r Σ_r^{1/2}, A_k = Σ_r^{1/2} V_rᵀ).

Follows the paper's equations (Sec. 3.2, weights p_k ∝ n_k); its released code (a FlexLoRA branch of
FederatedScope) was not read. The server keeps the SVD at the largest rank R as the global factors: a client of
rank r starts from their first r columns of B and rows of A, which is exactly the SVD of ΔW truncated at r
(the singular values come sorted). The global model the test set scores is therefore ΔW truncated at R, not
ΔW itself (equal when rank ΔW ≤ R). Each participant downloads its own rank's factors, r_k (d + k) values per
layer. The (α/rank) scale stays outside: the SVD is of Σ p_k B_k A_k.
"""

from __future__ import annotations

import torch

from fedagg.aggregators.adapter_rules import CombinedRule, exact_products
from fedagg.aggregators.base import AggregateResult, measured
from fedagg.aggregators.inputs import RoundInputs


def svd_factors(product: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B [d, rank], A [rank, k]) with B A the best rank-`rank` approximation of `product` [d, k] (zero columns
    and rows past its size); B = U Σ^{1/2}, A = Σ^{1/2} Vᵀ."""
    if not bool(torch.isfinite(product).all()):  # diverged uploads: the round's model is not finite either
        nan = float("nan")
        return product.new_full((product.shape[0], rank), nan), product.new_full((rank, product.shape[1]), nan)
    u, s, vh = torch.linalg.svd(product, full_matrices=False)
    root = s[:rank].sqrt()
    b, a = product.new_zeros(product.shape[0], rank), product.new_zeros(rank, product.shape[1])
    kept = root.numel()
    b[:, :kept], a[:kept] = u[:, :kept] * root, root[:, None] * vh[:kept]
    return b, a


class FlexLoRA(CombinedRule):
    """`conf/aggregator/flexlora.yaml`: the full-size weighted ΔW redistributed by SVD at each client's rank."""

    def combine(self, inputs: RoundInputs) -> AggregateResult:
        weights, metrics = measured(self.client_weights(inputs))
        weights = weights.to(inputs.client_params.dtype)
        layout = inputs.layout.adapters
        params = inputs.global_params.new_zeros(layout.num_params)
        for pair, product in zip(layout.pairs, exact_products(inputs, weights)):
            b, a = svd_factors(product, layout.rank)
            params[pair.b], params[pair.a] = b.reshape(-1), a.reshape(-1)
        return AggregateResult(params, weights, metrics=metrics)
