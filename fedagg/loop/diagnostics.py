"""Per-round diagnostics available for every aggregator.

N = ||w_{r+1} - w_r|| (the server step) and E = sum_k p_k ||Delta_k|| (the weighted client
steps) are the FedNNNN paper's NWDA quantities; their ratio shows how much averaging
shrinks the update. The weights' spread shows how far a method departs from FedAvg.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedagg.aggregators.blocks import update_norms


def weight_spread(weights: Tensor) -> dict[str, float]:
    """min, max and entropy (nats; 0 log 0 = 0) of the per-client weights."""
    w = weights.float()
    entropy = -(torch.special.xlogy(w, w)).sum()
    return {"weight_min": float(w.min()), "weight_max": float(w.max()), "weight_entropy": float(entropy)}


def round_diagnostics(old: Tensor, new: Tensor, client_params: Tensor, weights: Tensor,
                      block_rows: int | None = None) -> dict[str, float]:
    client_norms = update_norms(client_params, old, block_rows)
    return {
        "update_norm": float(torch.linalg.vector_norm(new - old)),
        "client_update_norm": float(weights.to(client_norms.dtype) @ client_norms),
        **weight_spread(weights),
    }
