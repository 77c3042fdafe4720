"""FedDyn (Acar et al. 2021, ICLR, Algorithm 1): one method, two halves.

The client half adds a dynamic regulariser to the local loss, -<g_k, θ> + α/2 ‖θ − w‖²,
and keeps per client id the gradient state g_k. The server keeps h, a running sum of the
clients' updates over ALL m clients, and subtracts h/α from the plain mean of the
participants' models: the correction that makes the fixed point of the regulariser the
stationary point of the global loss. `aggregator=feddyn` runs both; its YAML shares α.
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from fedagg.aggregators.base import AggregateResult, Aggregator
from fedagg.aggregators.inputs import Needs, RoundInputs
from fedagg.clients.objectives import LocalWork, Objective, squared_distance
from fedagg.clients.store import ClientStore
from fedagg.config.constraints import Range, Tune, checked

Alpha = Annotated[float, Range(gt=0, lt=float("inf"), words="use a finite number > 0")]


class FedDynClient(Objective):
    """Client half: task loss - <g_k, θ> + α/2 ‖θ − w‖²; after training g_k <- g_k - α (θ_k - w).

    g_k is zero until the client first trains (Acar et al., Algorithm 1).
    """

    @checked("aggregator.client.")
    def __init__(self, alpha: Alpha = 0.01) -> None:
        self.alpha = float(alpha)
        self.grad_state = ClientStore()  # client id -> g_k, on the host (spilled to the run folder past a budget)

    def penalty(self, params, anchor, state):
        linear = sum((g * p).sum() for g, p in zip(state, params))
        return -linear + 0.5 * self.alpha * squared_distance(params, anchor)

    def client_state(self, client_id, like):
        state = self.grad_state.get(client_id)
        return torch.zeros_like(like) if state is None else state.to(like.device)

    def after_training(self, client_id: int, trained: Tensor, global_params: Tensor, work: LocalWork) -> None:
        new = self.client_state(client_id, trained) - self.alpha * (trained - global_params)
        self.grad_state.put(client_id, new)  # every client ever seen keeps one

    def client_stores(self) -> dict[str, ClientStore]:
        return {"feddyn_grad_state": self.grad_state}

    def state_dict(self):
        return {"grad_state": self.grad_state.state_dict()}

    def load_state_dict(self, state):
        self.grad_state.load_state_dict(state["grad_state"])


class FedDyn(Aggregator):
    """`conf/aggregator/feddyn.yaml`: h ← h − α (1/m) Σ_k Δ_k;  w ← mean_k W_k − h/α."""

    @checked("aggregator.")
    def __init__(self, alpha: Annotated[Alpha, Tune(1e-3, 1e-1, log=True, source="Acar et al. 2021: alpha grid 10^-3, 10^-2, 10^-1")] = 0.01,
                 client: FedDynClient | None = None) -> None:
        super().__init__()
        self.alpha = float(alpha)
        client = FedDynClient(alpha) if client is None else client
        if client.alpha != self.alpha:
            raise ValueError(f"aggregator.client.alpha={client.alpha} is not allowed; both halves of FedDyn use "
                             f"aggregator.alpha={self.alpha} (set aggregator.alpha alone)")
        self.needs = Needs(client_half=client)
        self.h: Tensor | None = None  # [P] server state, zero before the first round

    def aggregate(self, inputs: RoundInputs) -> AggregateResult:
        global_params, client_params = inputs.global_params, inputs.client_params
        m_total = inputs.all_num_samples.numel()
        h = torch.zeros_like(global_params) if self.h is None else self.h.to(global_params.device)
        update_sum = inputs.updates.sum(dim=0)  # Σ_{k∈P} Δ_k
        self.h = h - self.alpha / m_total * update_sum  # Algorithm 1: h^t = h^{t-1} − α (1/m) Σ_k (θ_k^t − θ^{t-1})
        k = client_params.shape[0]
        weights = torch.full((k,), 1.0 / k, device=client_params.device, dtype=client_params.dtype)
        # θ^t = (1/|P|) Σ_k θ_k^t − h^t/α
        return AggregateResult(client_params.mean(dim=0) - self.h / self.alpha, weights,
                               metrics={"h_norm": float(torch.linalg.vector_norm(self.h))})

    def state_dict(self) -> dict:
        return {"h": None if self.h is None else self.h.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.h = None if state["h"] is None else state["h"].clone()
