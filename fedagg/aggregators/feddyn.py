"""FedDyn server half (Acar et al. 2021, ICLR, Algorithm 1; SPEC "Baselines").

The server keeps h, a running sum of the clients' updates over ALL m clients, and
subtracts h/α from the plain mean of the participants' models: the correction that makes
the fixed point of the dynamic regulariser the stationary point of the global loss.
It runs only with its client half, `client/objective=feddyn`, at the same α; the round
loop checks both (`pairs_with`, `alpha`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fedagg.aggregators.base import Aggregator
from fedagg.models.flat import ParamLayout


class FedDyn(Aggregator):
    """`conf/aggregator/feddyn.yaml`: h ← h − α (1/m) Σ_k Δ_k;  w ← mean_k W_k − h/α."""

    pairs_with = "feddyn"

    def __init__(self, alpha: float = 0.01) -> None:
        super().__init__()
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < float("inf"):
            raise ValueError(f"aggregator.alpha={alpha!r} is not allowed; use a finite number > 0 equal to client.objective.alpha")
        self.alpha = float(alpha)
        self.h: Tensor | None = None  # [P] server state, zero before the first round

    def aggregate(
        self,
        global_params: Tensor,
        client_params: Tensor,
        num_samples: Tensor,
        *,
        client_ids: Tensor,
        round: int,
        layout: ParamLayout | None = None,
        val_acc: Tensor | None = None,
        **extra: Any,
    ) -> Tensor:
        all_num_samples = extra.get("all_num_samples")
        if all_num_samples is None:
            raise ValueError("feddyn needs all_num_samples [num_clients]: h averages over all m clients, not the participants")
        m_total = all_num_samples.numel()
        h = torch.zeros_like(global_params) if self.h is None else self.h.to(global_params.device)
        update_sum = (client_params - global_params).sum(dim=0)  # Σ_{k∈P} Δ_k
        self.h = h - self.alpha / m_total * update_sum  # Algorithm 1: h^t = h^{t-1} − α (1/m) Σ_k (θ_k^t − θ^{t-1})
        k = client_params.shape[0]
        self.last_weights = torch.full((k,), 1.0 / k, device=client_params.device, dtype=client_params.dtype)
        return client_params.mean(dim=0) - self.h / self.alpha  # θ^t = (1/|P|) Σ_k θ_k^t − h^t/α

    def state_dict(self) -> dict:
        return {"h": None if self.h is None else self.h.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.h = None if state["h"] is None else state["h"].clone()
