"""SCAFFOLD (Karimireddy et al. 2020, Algorithm 1, control variates option II).

Client drift is corrected with control variates: the server keeps c [P], each client id
its own c_k [P] (both zero at the start). A participating client takes its local steps on
∇ℓ(θ) − c_k + c, written as the linear term ⟨c − c_k, θ⟩ of its loss so that the correction
enters the gradient before the optimizer's weight decay and momentum, in either engine.
After its τ_k steps at learning rate η_l it sets c_k⁺ = c_k − c + (w − W_k)/(τ_k η_l),
keeps it and sends Δc_k = c_k⁺ − c_k with its model. The server moves
w ← w + η_g Σ_k p_k Δ_k and c ← c + (1/N) Σ_k Δc_k over all N clients.
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from fedagg.aggregators.base import Aggregator, Weighting
from fedagg.aggregators.inputs import Bits, Needs, RoundInputs, dense
from fedagg.clients.objectives import LocalWork, Objective
from fedagg.clients.store import ClientStore
from fedagg.config.constraints import Range, Tune, checked


class ScaffoldClient(Objective):
    """Client half: the correction c − c_k in the loss; c_k per client id; Δc_k sent to the server."""

    def __init__(self) -> None:
        self.c: Tensor | None = None  # the server variate as last sent to the clients
        self.variates = ClientStore()  # client id -> c_k, on the host (spilled to the run folder past a budget)

    def penalty(self, params, anchor, state):
        return sum((s * p).sum() for s, p in zip(state, params))  # its gradient is c − c_k

    def client_state(self, client_id: int, like: Tensor) -> Tensor:
        c = torch.zeros_like(like) if self.c is None else self.c.to(like)
        c_k = self.variates.get(client_id)
        return c if c_k is None else c - c_k.to(like.device)

    def after_training(self, client_id: int, trained: Tensor, global_params: Tensor, work: LocalWork) -> dict:
        c = torch.zeros_like(trained) if self.c is None else self.c.to(trained)
        c_k = self.variates.get(client_id)
        c_k = torch.zeros_like(trained) if c_k is None else c_k.to(trained.device)
        updated = c_k - c + (global_params - trained) / (work.steps * work.lr)  # option II
        self.variates.put(client_id, updated)  # every client ever seen keeps one
        return {"delta_c": updated - c_k}

    def client_stores(self) -> dict[str, ClientStore]:
        return {"scaffold_variates": self.variates}

    def state_dict(self) -> dict:
        return {"variates": self.variates.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.variates.load_state_dict(state["variates"])


class Scaffold(Aggregator):
    """`conf/aggregator/scaffold.yaml`: w ← w + η_g Σ_k p_k Δ_k;  c ← c + (1/N) Σ_k Δc_k; state: c."""

    @checked("aggregator.")
    def __init__(self, lr: Annotated[float, Range(gt=0, lt=float("inf"), words="use a finite number > 0 (the paper: 1)"),
                                     Tune(0.1, 3.0, log=True, source="no grid in Karimireddy et al. 2020 (they use 1): a decade below to 3")] = 1.0,
                 weighting: Weighting = "uniform", client: ScaffoldClient | None = None) -> None:
        super().__init__(weighting)  # uniform: the paper's server averages the participants
        self.lr = float(lr)
        self.client = ScaffoldClient() if client is None else client
        self.needs = Needs(client_half=self.client)

    def bits(self, num_params: int) -> Bits:
        """Twice the dense model each way: down w and c, up the trained model and Δc_k."""
        return Bits(down=2 * dense(num_params), up=2 * dense(num_params), beside_model=dense(num_params))

    def server_update(self, inputs: RoundInputs, update: Tensor) -> tuple[Tensor, dict[str, float]]:
        delta_c = inputs.payloads["delta_c"]
        c = torch.zeros_like(inputs.global_params) if self.client.c is None else self.client.c
        self.client.c = c + delta_c.sum(dim=0) / inputs.all_num_samples.numel()  # sent to the next round's clients
        return inputs.global_params + self.lr * update, {"variate_norm": torch.linalg.vector_norm(self.client.c)}

    def state_dict(self) -> dict:
        return {"c": None if self.client.c is None else self.client.c.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.client.c = None if state["c"] is None else state["c"].clone()
