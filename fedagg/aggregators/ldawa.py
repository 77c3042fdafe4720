"""L-DAWA (Rehman et al. 2023, ICCV): layer-wise divergence-aware weights.

Every parameter tensor ("layer", `layout.slices`) is aggregated with its own weights: a
client whose layer points the same way as the global layer counts more,
p_{k,l} ∝ max(cos(W_k^l, w^l), 0), normalised over the clients of the round. The weights
are recomputed from scratch each round; no state.
"""

from __future__ import annotations

import torch

from fedagg.aggregators.base import AggregateResult, Aggregator
from fedagg.aggregators.inputs import RoundInputs

COS_EPS = 1e-8  # guards cos of an all-zero layer (e.g. a BatchNorm bias at init): cos = 0 there


class LDAWA(Aggregator):
    """`conf/aggregator/ldawa.yaml`: per layer l, new w^l = Σ_k p_{k,l} W_k^l.

    A layer where no client has a positive cosine (all clipped to 0, or the global layer is
    all zeros) falls back to the plain mean over clients for that layer. The reported weights
    (used for BatchNorm buffers, diagnostics and weights.csv) is each client's mean weight
    over layers.
    """

    def __init__(self) -> None:
        super().__init__()

    def aggregate(self, inputs: RoundInputs) -> AggregateResult:
        global_params, client_params, layout = inputs.global_params, inputs.client_params, inputs.layout
        if layout.num_params != global_params.numel():
            raise ValueError(f"ldawa: the layout covers {layout.num_params} parameters but the vectors have {global_params.numel()}")
        k = client_params.shape[0]
        new = torch.empty_like(global_params)
        weights = []
        for s in layout.slices:
            W, w = client_params[:, s], global_params[s]
            norms = torch.linalg.vector_norm(W, dim=1) * torch.linalg.vector_norm(w)
            cos = W @ w / norms.clamp_min(COS_EPS)  # cos(W_k^l, w^l): the layer's angular divergence
            score = cos.clamp_min(0.0)  # a layer pointing away from the global one gets no say
            total = score.sum()
            p = torch.where(total > 0, score / torch.where(total > 0, total, 1.0), 1.0 / k)  # normalised over clients
            new[s] = p @ W  # w^l = Σ_k p_{k,l} W_k^l
            weights.append(p)
        return AggregateResult(new, torch.stack(weights, dim=1).mean(dim=1))
