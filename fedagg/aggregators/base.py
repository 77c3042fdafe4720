"""The aggregator contract, with FedAvg semantics as the base (DESIGN "Aggregator").

A method overrides one step: `client_weights` (how clients are weighted) or
`server_update` (how the weighted mean update is applied). `aggregate` ties them
together and records the weights it used in `last_weights`, which the round loop uses
for BatchNorm buffers, the `client_update_norm` diagnostic and `weights.csv`. A method
whose rule is not "weights, then one update" overrides `aggregate` itself and still sets
`last_weights` ([K], summing to 1; element-wise rules report each client's mean weight).

State that must survive a resume goes in `state_dict()`; per-client state is keyed by
the client's global id (`client_ids`), never by its position in this round's sample.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fedagg.models.flat import ParamLayout

WEIGHTINGS = ("samples", "uniform")


def sample_weights(num_samples: Tensor) -> Tensor:
    """D_k = n_k / sum_j n_j, as float on the samples' device."""
    n = num_samples.to(torch.float32)
    return n / n.sum()


class Aggregator:
    """FedAvg (McMahan 2017): w + sum_k p_k (W_k - w), p = D (samples) or 1/K (uniform)."""

    requires: frozenset[str] = frozenset()
    # a method whose paper tests another model than the one it sends to clients sets this each round
    eval_params: Tensor | None = None
    # the client objective this server half belongs with (FedDyn), None for any objective
    pairs_with: str | None = None

    def __init__(self, weighting: str = "samples") -> None:
        if weighting not in WEIGHTINGS:
            raise ValueError(f"aggregator.weighting={weighting!r} is not allowed; choose one of {', '.join(WEIGHTINGS)}")
        self.weighting = weighting
        self.last_weights: Tensor | None = None

    def client_weights(self, num_samples: Tensor, **context: Any) -> Tensor:
        """[K] non-negative weights summing to 1."""
        if self.weighting == "uniform":
            k = num_samples.numel()
            return torch.full((k,), 1.0 / k, device=num_samples.device)
        return sample_weights(num_samples)

    def server_update(self, global_params: Tensor, update: Tensor, *, round: int) -> Tensor:
        """Apply the weighted mean update sum_k p_k Delta_k to the global parameters."""
        return global_params + update

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
        weights = self.client_weights(
            num_samples,
            global_params=global_params,
            client_params=client_params,
            client_ids=client_ids,
            round=round,
            layout=layout,
            val_acc=val_acc,
            **extra,
        ).to(client_params.dtype)
        self.last_weights = weights
        update = weights @ (client_params - global_params)
        return self.server_update(global_params, update, round=round)

    def buffer_weights(self, num_samples: Tensor) -> Tensor:
        """[K] weights for averaging buffers (BatchNorm statistics): the client weights just used."""
        return self.last_weights if self.last_weights is not None else sample_weights(num_samples)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class FedAvg(Aggregator):
    """`conf/aggregator/fedavg.yaml`; the base class already is FedAvg."""
