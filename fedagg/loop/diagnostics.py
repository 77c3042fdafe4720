"""Per-round diagnostics available for every aggregator.

N = ||w_{r+1} - w_r|| (the server step) and E = sum_k p_k ||Delta_k|| (the weighted client
steps) are the FedNNNN paper's NWDA quantities; their ratio shows how much averaging
shrinks the update. The weights' spread shows how far a method departs from FedAvg.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedagg.aggregators.blocks import update_norms
from fedagg.aggregators.inputs import RoundInputs


def weight_spread(weights: Tensor) -> dict[str, float]:
    """min, max and entropy (nats; 0 log 0 = 0) of the per-client weights."""
    w = weights.float()
    entropy = -(torch.special.xlogy(w, w)).sum()
    return {"weight_min": float(w.min()), "weight_max": float(w.max()), "weight_entropy": float(entropy)}


def round_diagnostics(inputs: RoundInputs, new: Tensor, weights: Tensor) -> dict[str, float]:
    """The server step's norm (new against the round's global model), the weighted clients' update norms, the
    weights' spread."""
    client_norms = update_norms(inputs)
    return {
        "update_norm": float(torch.linalg.vector_norm(new - inputs.global_params)),
        "client_update_norm": float(weights.to(client_norms.dtype) @ client_norms),
        **weight_spread(weights),
    }
