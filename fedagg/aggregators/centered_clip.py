"""Centered clipping (Karimireddy, He, Jaggi 2021).

Starting from a centre v (the global model, i.e. a zero update, or with `start: momentum`
the last round's aggregate update), each of L iterations moves v by the mean of the
clients' offsets from it, each offset clipped to norm τ:
v ← v + (1/K) Σ_k (Δ_k − v) min(1, τ / ‖Δ_k − v‖). One far-away client can move v by at
most τ/K. Reported weights are uniform (fedagg's choice).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from fedagg.aggregators.inputs import RoundInputs
from fedagg.aggregators.robust import Count, Positive, RobustRule, uniform
from fedagg.config.constraints import checked


class CenteredClip(RobustRule):
    """`conf/aggregator/centered_clip.yaml`: w + v after L clipping iterations; state: the last aggregate update."""

    @checked("aggregator.")
    def __init__(self, tau: Positive = 10.0, iterations: Count = 1, start: Literal["global", "momentum"] = "global",
                 bucket_size: Count = 1) -> None:
        super().__init__(bucket_size)
        self.tau, self.iterations = float(tau), iterations
        self.start = start
        self.previous: Tensor | None = None  # last round's aggregate update

    def combine(self, inputs: RoundInputs, models: Tensor, num_samples: Tensor) -> tuple[Tensor, Tensor]:
        updates = models - inputs.global_params
        v = torch.zeros_like(inputs.global_params)
        if self.start == "momentum" and self.previous is not None:
            v = self.previous.to(v)
        for _ in range(self.iterations):
            offsets = updates - v
            scale = (self.tau / torch.linalg.vector_norm(offsets, dim=1).clamp_min(1e-12)).clamp(max=1.0)
            v = v + (scale[:, None] * offsets).mean(dim=0)
        self.previous = v
        return inputs.global_params + v, uniform(models.shape[0], models)

    def state_dict(self) -> dict:
        return {"previous": None if self.previous is None else self.previous.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.previous = None if state["previous"] is None else state["previous"].clone()
