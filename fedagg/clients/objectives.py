"""Client objectives: what local training minimises besides the task loss.

An objective adds a term to the local loss and may keep per-client state across rounds
(FedDyn's gradient correction). It is written over lists of parameter tensors, so the
sequential engine calls it on a model's parameters and a parallel engine can vmap it over
stacked clients. `conf/client/objective/*.yaml` selects one: `client/objective=fedprox`.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _squared_distance(params: list[Tensor], anchor: list[Tensor]) -> Tensor:
    return sum(((p - a) ** 2).sum() for p, a in zip(params, anchor))


class Objective:
    """Plain empirical risk: nothing added, nothing kept."""

    stateful = False
    pairs_with: str | None = None  # the aggregator this client half belongs with (FedDyn)

    def penalty(self, params: list[Tensor], anchor: list[Tensor], state: list[Tensor] | None) -> Tensor | None:
        """Term added to the batch loss; `anchor` is the round's global model, `state` this client's."""
        return None

    def client_state(self, client_id: int, like: Tensor) -> Tensor | None:
        """This client's flat state [P] (None for stateless objectives)."""
        return None

    def after_training(self, client_id: int, trained: Tensor, global_params: Tensor) -> None:
        """Update this client's state from its trained flat parameters."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class FedProx(Objective):
    """FedProx (Li et al. 2020): task loss + mu/2 ||theta - w||^2; the server is plain FedAvg."""

    def __init__(self, mu: float = 0.01) -> None:
        if not mu >= 0:
            raise ValueError(f"client.objective.mu={mu!r} is not allowed; it must be >= 0")
        self.mu = mu

    def penalty(self, params, anchor, state):
        return 0.5 * self.mu * _squared_distance(params, anchor)


class FedDyn(Objective):
    """FedDyn (Acar et al. 2021), client half: task loss - <g_k, theta> + alpha/2 ||theta - w||^2.

    g_k is the client's gradient state (zero until it first trains); after training
    g_k <- g_k - alpha (theta_k - w) (Acar et al., Algorithm 1). The server half is the
    `feddyn` aggregator.
    """

    stateful = True
    pairs_with = "feddyn"

    def __init__(self, alpha: float = 0.01) -> None:
        if not alpha > 0:
            raise ValueError(f"client.objective.alpha={alpha!r} is not allowed; it must be > 0")
        self.alpha = alpha
        self.grad_state: dict[int, Tensor] = {}

    def penalty(self, params, anchor, state):
        linear = sum((g * p).sum() for g, p in zip(state, params))
        return -linear + 0.5 * self.alpha * _squared_distance(params, anchor)

    def client_state(self, client_id, like):
        return self.grad_state.get(client_id, torch.zeros_like(like))

    def after_training(self, client_id, trained, global_params):
        self.grad_state[client_id] = self.client_state(client_id, trained) - self.alpha * (trained - global_params)

    def state_dict(self):
        return {"grad_state": {k: v.clone() for k, v in self.grad_state.items()}}

    def load_state_dict(self, state):
        self.grad_state = {int(k): v.clone() for k, v in state["grad_state"].items()}
