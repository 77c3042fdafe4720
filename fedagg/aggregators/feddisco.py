"""FedDisco (Ye et al. 2023, ICML): discrepancy-aware aggregation weights.

A client whose label distribution is far from the global one gets less weight than its
data size alone would give: p_k ∝ ReLU(D_k − a d_k + b), where d_k is the L2 distance
between the two distributions. The weights depend only on the (fixed) label counts, so
a client keeps its weight relative to the same co-participants in every round; no state.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from torch import Tensor

from fedagg.aggregators.base import Aggregator, sample_weights
from fedagg.aggregators.inputs import Needs, RoundInputs
from fedagg.config.constraints import Range, checked


class FedDisco(Aggregator):
    """`conf/aggregator/feddisco.yaml`: p_k ∝ ReLU(D_k − a d_k + b); new global Σ p_k W_k.

    `reference: global` (fedagg's choice) measures d_k against the label distribution of all clients'
    training data; `uniform` against the uniform distribution over classes, which is what
    the authors' released code uses (their test sets are balanced).

    `discrepancy: l2` (fedagg's choice) is the L2 distance; `kl` is the authors' code's KL variant:
    KL(local ‖ reference) divided by its sum over the round's participants, so the d_k sum
    to 1 and a = 0.5, b = 0.1 keep more clients above zero under strong label skew.
    """

    needs = Needs(label_hist=True)

    @checked("aggregator.")
    def __init__(self, a: Annotated[float, Range(ge=0, finite=True, words="use a finite number >= 0, e.g. 0.5")] = 0.5,
                 b: Annotated[float, Range(finite=True, words="use a finite number, e.g. 0.1")] = 0.1,
                 reference: Literal["global", "uniform"] = "global", discrepancy: Literal["l2", "kl"] = "l2") -> None:
        super().__init__()
        self.a, self.b = float(a), float(b)
        self.reference, self.discrepancy = reference, discrepancy

    def client_weights(self, inputs: RoundInputs) -> tuple[Tensor, dict[str, float]]:
        hist, global_hist = inputs.need("label_hist"), inputs.need("global_label_hist")
        device = inputs.client_params.device
        counts = hist.to(device=device, dtype=torch.float32)
        # clamp: a row sums to the client's sample count (>= 1 for any partition), so this never bites on real data
        local = counts / counts.sum(dim=1, keepdim=True).clamp_min(1.0)
        if self.reference == "uniform":
            target = torch.full_like(local[0], 1.0 / local.shape[1])
        else:
            g = global_hist.to(device=device, dtype=torch.float32)
            target = g / g.sum().clamp_min(1.0)
        d = self._discrepancy(local, target)
        D = sample_weights(inputs.num_samples).to(device)  # D_k over this round's participants
        score = torch.relu(D - self.a * d + self.b)  # discrepancy-aware weight before normalising
        total = score.sum()
        # every score clipped to 0 (only with a large a or a negative b): fall back to data size, FedAvg;
        # clipped: the participants whose discrepancy cost them all weight
        return torch.where(total > 0, score / torch.where(total > 0, total, 1.0), D), {"clipped": (score == 0).sum()}

    def _discrepancy(self, local: Tensor, target: Tensor) -> Tensor:
        """d_k for every participant: [K] from label distributions [K, C] and the reference [C]."""
        if self.discrepancy == "l2":
            return torch.linalg.vector_norm(local - target, dim=1)
        # 0 log 0 = 0; a class the reference lacks but a client has would be infinite: the global
        # reference always holds every client's classes and the uniform one every class
        kl = torch.where(local > 0, local * (local.clamp_min(1e-30) / target.clamp_min(1e-30)).log(), 0.0).sum(dim=1)
        total = kl.sum()
        return kl / total if total > 0 else torch.zeros_like(kl)  # every client matches: no discrepancy
