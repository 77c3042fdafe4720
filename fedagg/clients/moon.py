"""MOON (Li, He, Song, CVPR 2021): model-contrastive
local training, `client/objective=moon`.

ℓ = CE(f(x), y) + μ · mean_batch ℓ_con with, for each sample, z the local model's representation, z_g the
round's global model's and z_p the client's previous local model's (both frozen),
ℓ_con = −log( e^{cos(z, z_g)/τ} / (e^{cos(z, z_g)/τ} + e^{cos(z, z_p)/τ}) ). A client with no previous model
(never trained before) has no contrastive term, as in the authors' first round. `projection: head` (the
paper and QinbinLi/MOON's ModelFedCon) takes z after a projection head h -> d -> ReLU -> `projection_dim`
that the run puts under the classifier; `projection: none` (FL-bench, PFLlib) takes h itself, and a
`projection_dim` set with it is noted at the start (null: 256 under a head, the authors' code's out_dim).
"""

from __future__ import annotations

import logging
from typing import Annotated, Literal

import torch
import torch.nn.functional as F

from fedagg.clients.objectives import Objective, Sees, Seen, elementwise
from fedagg.config.constraints import Range, Tune, checked

PROJECTION_DIM = 256  # the authors' code's out_dim (QinbinLi/MOON)
log = logging.getLogger("fedagg")


class MOON(Objective):
    @checked("client.objective.")
    def __init__(self,
                 mu: Annotated[float, Range(ge=0, finite=True),
                               Tune(1e-3, 10.0, log=True,
                                    source="Li et al. 2021 (Sec. 4.2): mu grid 0.001, 0.01, 0.1, 1, 5, 10")] = 1.0,
                 temperature: Annotated[float, Range(gt=0, finite=True),
                                        Tune(0.1, 1.0, log=True, source="Li et al. 2021: tau grid 0.1, 0.5, 1")] = 0.5,
                 projection: Literal["head", "none"] = "head",
                 projection_dim: Annotated[int | None, Range(ge=1, integer=True, words="it must be an integer >= 1, or "
                                                             "null (256 under a head)")] = None,
                 ) -> None:
        self.mu, self.temperature = float(mu), float(temperature)
        self.projection = projection
        self.projection_dim = PROJECTION_DIM if projection_dim is None else int(projection_dim)
        self.dim_unread = projection_dim is not None and projection == "none"  # noted by `setup`, at the start
        self.sees = Sees(representation=True, global_model=True, previous_model=True,
                         projection_head=self.projection_dim if projection == "head" else 0)

    def setup(self, model) -> None:
        if self.dim_unread:  # legal, but there is no head to size
            log.warning("client.objective.projection_dim=%d does nothing with client.objective.projection=none: the "
                        "representation is the backbone's own; projection=head puts a head of that width under the "
                        "classifier", self.projection_dim)

    def forward_term(self, seen: Seen) -> torch.Tensor | None:
        if seen.previous is None:  # no client of this call has trained before
            return None
        z = seen.local.features.flatten(0, -2)  # a sequence model's positions count as samples
        positive = F.cosine_similarity(z, seen.global_model.features.flatten(0, -2), dim=-1) / self.temperature
        negative = F.cosine_similarity(z, seen.previous.features.flatten(0, -2), dim=-1) / self.temperature
        # -log(e^p / (e^p + e^n)) = log(1 + e^(n - p))
        term = self.mu * elementwise(F.softplus, negative - positive).mean()
        if seen.has_previous is not None:  # a client without a previous model (its stand-in is the global one)
            term = torch.where(seen.has_previous, term, torch.zeros_like(term))
        return term
