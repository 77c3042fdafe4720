"""FedLC (Zhang et al., ICML 2022): logit calibration,
`client/objective=fedlc`.

ℓ = CE(f(x) − τ · n_k^{−1/4}, y), with n_k the client's own training samples per class (a vector subtracted
from every row of logits). A class the client lacks (n = 0) gets the calibrated logit −∞, out of the
softmax (`absent: removed`, bytedance/FedDecorr's port); `absent: epsilon` counts it as 1e-8 samples
(FL-bench). Only training is calibrated: the model is scored on its own logits.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch

from fedagg.clients.objectives import Objective, Sees, Seen, elementwise
from fedagg.config.constraints import Range, Tune, checked

ABSENT_COUNT = 1e-8  # FL-bench's count of a class the client lacks (src/client/fedlc.py)


def _quartic_root(n: torch.Tensor) -> torch.Tensor:  # n^(-1/4), through `elementwise`: the CPU rounds it by place
    return n.pow(-0.25)


class FedLC(Objective):
    sees = Sees(label_counts=True)

    @checked("client.objective.")
    def __init__(self,
                 tau: Annotated[float, Range(ge=0, finite=True),
                                Tune(0.01, 10.0, log=True,
                                     source="no grid in Zhang et al. 2022; FedDecorr's port uses 0.1, FL-bench and "
                                            "PFLlib 1.0: a decade below the one to a decade above the other")] = 1.0,
                 absent: Literal["removed", "epsilon"] = "removed") -> None:
        self.tau, self.absent = float(tau), absent

    def task_logits(self, seen: Seen) -> torch.Tensor:
        counts = seen.label_counts
        if self.absent == "epsilon":
            shift = self.tau * elementwise(_quartic_root, counts.clamp(min=ABSENT_COUNT))
        else:
            shift = torch.where(counts > 0, self.tau * elementwise(_quartic_root, counts.clamp(min=1)), torch.inf)
        return seen.local.logits - shift
