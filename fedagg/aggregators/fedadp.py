"""FedAdp (Wu & Wang, IEEE TCCN 2021): weight clients by how well their update aligns with the mean.

The angle between each client's update and the data-weighted mean update is smoothed per
client id over rounds (eq. 8), mapped through a Gompertz curve (eq. 9) and turned into
weights by a size-weighted softmax (eq. 10); the new global is `w + sum_k psi_k Delta_k`.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from torch import Tensor

from fedagg.aggregators.base import Aggregator, sample_weights
from fedagg.aggregators.inputs import RoundInputs
from fedagg.config.constraints import Flag, Range, Tune, checked


class FedAdp(Aggregator):
    """`conf/aggregator/fedadp.yaml`; state: smoothed angle and participation count per client id."""

    @checked("aggregator.")
    def __init__(self, alpha: Annotated[float, Range(gt=0, words="use a positive number (paper: 5)"),
                                   Tune(1.0, 10.0, source="no grid in Wu & Wang (they use 5): 1 to 10 around it")] = 5.0,
                 smoothing: Literal["round", "participation"] = "round",
                 use_sizes: Annotated[bool, Flag("use true or false")] = True) -> None:
        super().__init__("samples")  # the global gradient (Alg. 1 line 9) is always D-weighted
        self.alpha, self.smoothing, self.use_sizes = float(alpha), smoothing, use_sizes
        self.angles: dict[int, Tensor] = {}  # client id -> smoothed angle (radians, 0-d)
        self.counts: dict[int, int] = {}  # client id -> rounds it took part in

    def client_weights(self, inputs: RoundInputs) -> tuple[Tensor, dict[str, float]]:
        W, r, num_samples = inputs.client_params, inputs.round, inputs.num_samples
        ids = [int(i) for i in inputs.client_ids.tolist()]
        delta = inputs.updates
        g = sample_weights(num_samples).to(W.dtype) @ delta  # Alg. 1 line 9 (sign does not change the angle)
        denom = torch.linalg.vector_norm(delta, dim=1) * torch.linalg.vector_norm(g)
        # eq. 7; a zero norm has no direction, fedagg's design sets its angle to 0
        cos = torch.where(denom > 0, (delta @ g) / torch.where(denom > 0, denom, 1.0), 1.0)
        theta = torch.arccos(cos.clamp(-1.0, 1.0))

        seen = torch.tensor([i in self.angles for i in ids], device=W.device)
        prev = torch.stack([self.angles[i].to(theta) if i in self.angles else theta.new_zeros(()) for i in ids])
        for i in ids:
            self.counts[i] = self.counts.get(i, 0) + 1
        # t in eq. 8: the global round (paper: every node takes part every round), or this client's count
        t = theta.new_tensor([float(r) if self.smoothing == "round" else float(self.counts[i]) for i in ids])
        smoothed = torch.where(seen, (t - 1) / t * prev + theta / t, theta)  # eq. 8, first sighting: theta
        for i, s in zip(ids, smoothed):
            self.angles[i] = s.clone()

        a = self.alpha
        f = a * (1 - torch.exp(-torch.exp(-a * (smoothed - 1))))  # eq. 9 (Gompertz)
        n = num_samples.to(W.dtype) if self.use_sizes else torch.ones_like(f)
        # eq. 10: n e^f / sum n e^f, safe for large alpha; the angle (radians): how far the participants point
        # from the mean update
        return torch.softmax(f + torch.log(n), dim=0), {"angle": smoothed.mean()}

    def state_dict(self) -> dict:
        return {"angles": {i: s.clone() for i, s in self.angles.items()}, "counts": dict(self.counts)}

    def load_state_dict(self, state: dict) -> None:
        self.angles = {int(i): s.clone() for i, s in state["angles"].items()}
        self.counts = {int(i): int(c) for i, c in state["counts"].items()}
