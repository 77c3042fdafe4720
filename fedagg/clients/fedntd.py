"""FedNTD (Lee et al., NeurIPS 2022; Lee-Gihun/FedNTD@be00ee5): not-true distillation, `client/objective=fedntd`.

Each sample's true-class logit is removed from the local and the round's global model's logits (frozen);
q̃ = softmax of the remaining C − 1 at temperature τ; ℓ = CE(f(x), y) + β · τ² · KL(q̃_global ‖ q̃_local),
averaged over the batch.
"""

from __future__ import annotations

from typing import Annotated

import torch
import torch.nn.functional as F

from fedagg.clients.objectives import Objective, Sees, Seen
from fedagg.config.constraints import Range, Tune, checked
from fedagg.models.base import at_least_float32


def not_true(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[N, C] logits without each row's true class y [N]: [N, C − 1], the others in their order."""
    c = logits.shape[-1]
    others = torch.arange(c - 1, device=logits.device).unsqueeze(0)
    return logits.gather(-1, others + (others >= y.unsqueeze(-1)).long())  # skip the true column


class FedNTD(Objective):
    sees = Sees(global_model=True)

    @checked("client.objective.")
    def __init__(self,
                 tau: Annotated[float, Range(gt=0, finite=True),
                                Tune(0.5, 4.0, log=True,
                                     source="the authors' code: 1 (config/fedntd.json), 3 (NTD_Loss default)")] = 1.0,
                 beta: Annotated[float, Range(ge=0, finite=True),
                                 Tune(0.1, 10.0, log=True,
                                      source="a decade either side of the authors' beta = 1 (config/fedntd.json)")] = 1.0,
                 ) -> None:
        self.tau, self.beta = float(tau), float(beta)

    def forward_term(self, seen: Seen) -> torch.Tensor:
        y = seen.y.flatten()
        local = not_true(at_least_float32(seen.local.logits.flatten(0, -2)), y)
        teacher = not_true(at_least_float32(seen.global_model.logits.flatten(0, -2)), y)
        log_q = F.log_softmax(local / self.tau, dim=-1)
        p = F.softmax(teacher / self.tau, dim=-1)
        kl = (torch.xlogy(p, p) - p * log_q).sum(-1).mean()  # KLDivLoss(reduction="batchmean")
        return self.beta * self.tau**2 * kl
