"""FedAMS and FedCAMS (Wang, Lin, Chen 2022, "Communication-Efficient Adaptive FL").

FedAMS (their Algorithm 1) is FedAdam with AMSGrad's max stabilization: the denominator
uses v_hat = max(v_hat, v, eps), which never shrinks, so the server step can only get
more cautious, and eps (v_hat's start) bounds the step by lr * |m| / sqrt(eps).
FedCAMS (their Algorithm 2) adds compressed uploads with error feedback: each client id
keeps the part of its update the compressor dropped and adds it to its next update. That
client side is the upload channel's: FedCAMS declares ErrorFeedback(Sign()) (or TopK with
rounding=floor) as its channel stages, placed right after the attack, so it is
`aggregator=fedams channel=[attack,sign]` (or topk with rounding=floor), bit for bit; with the
default `channel=sign` the channel compresses before the attack instead.
With `bias_correction: true` (the authors' code) m is divided by 1 - b1^r and v_hat by
1 - b2^r in the step only; the max is taken over the uncorrected v, as in that code.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from torch import Tensor

from fedagg.aggregators.base import Weighting
from fedagg.aggregators.fedopt import Beta, FedAdam, Rate
from fedagg.aggregators.inputs import Bits, RoundInputs, dense
from fedagg.channel.base import Stage
from fedagg.channel.compress import Sign, TopK
from fedagg.channel.feedback import ErrorFeedback
from fedagg.config.constraints import Flag, Range, checked

# eps > 0 is what keeps sqrt(v_hat) away from 0 when g is all zeros
Eps = Annotated[float, Range(gt=0, words="it must be > 0")]


class FedAMS(FedAdam):
    """`conf/aggregator/fedams.yaml`: Adam moments on g, v_hat = max(v_hat, v, eps), w + lr m / sqrt(v_hat)."""

    @checked("aggregator.")
    def __init__(
        self,
        weighting: Weighting = "samples",
        lr: Rate = 1.0,
        beta1: Beta = 0.9,
        beta2: Beta = 0.99,
        eps: Eps = 1e-3,
        bias_correction: Annotated[bool, Flag()] = False,
    ) -> None:
        # tau = 0: no additive term in the denominator, and v starts at 0 (Alg. 1: m_0 = v_0 = 0)
        super().__init__(weighting, lr, beta1, beta2, tau=0.0, bias_correction=bias_correction)
        self.eps = float(eps)
        self.v_hat: Tensor | None = None  # [P] running max of v; starts at eps

    def server_update(self, inputs: RoundInputs, update: Tensor) -> Tensor:
        c1, c2 = self.advance(update)  # m <- b1 m + (1-b1) g; v <- b2 v + (1-b2) g^2 (Alg. 1)
        if self.v_hat is None:
            self.v_hat = torch.full_like(update, self.eps)
        self.v_hat = torch.maximum(self.v_hat, self.v).clamp_min(self.eps)  # Alg. 1, option FedAMS
        return inputs.global_params + self.lr * (self.m / c1) / (self.v_hat / c2).sqrt()  # Alg. 1 server step

    def state_dict(self) -> dict:
        return {**super().state_dict(), "v_hat": None if self.v_hat is None else self.v_hat.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.v_hat = None if state["v_hat"] is None else state["v_hat"].clone()


class FedCAMS(FedAMS):
    """`conf/aggregator/fedcams.yaml`: FedAMS on g = sum_k p_k C(Delta_k + e_k), error feedback per client id: the
    compression is the upload channel's ErrorFeedback(Sign()) or ErrorFeedback(TopK(rounding=floor)), which the
    rule declares (`channel_stages`) and the run puts right after the attack (Alg. 2, client side)."""

    weighted_mean = False  # it compresses inside: channel=dp would clip what it then changes
    compresses_uploads = True
    same_uncompressed = "aggregator=fedams"  # with the channel's sign or topk (rounding=floor): see the module

    @checked("aggregator.")
    def __init__(
        self,
        weighting: Weighting = "samples",
        lr: Rate = 1.0,
        beta1: Beta = 0.9,
        beta2: Beta = 0.99,
        eps: Eps = 1e-3,
        bias_correction: Annotated[bool, Flag()] = False,
        compressor: Literal["sign", "topk"] = "sign",
        ratio: Annotated[float, Range(gt=0, le=1, words="it must be in (0, 1]")] = 1 / 64,
    ) -> None:
        super().__init__(weighting, lr, beta1, beta2, eps, bias_correction)
        self.compressor, self.ratio = compressor, float(ratio)
        # the upload channel's compressors (one implementation); top-k rounds rho * P down, as the reference code
        self.stage = Sign(error_feedback=False) if compressor == "sign" else TopK(ratio=ratio, error_feedback=False, rounding="floor")
        self.feedback = ErrorFeedback(self.stage, measure=True)  # e_k by client id; absent: e_k = 0

    def channel_stages(self) -> list[Stage]:
        return [self.feedback]

    def server_update(self, inputs: RoundInputs, update: Tensor):
        """FedAMS on sum_k p_k c_k; error_norm: the mean ||e_k|| compression held back this round."""
        new = super().server_update(inputs, update)
        held = self.feedback.held_back
        return (new, {"error_norm": held}) if held is not None else new

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "errors" in state:  # a checkpoint from before the chain kept e_k here ({id: tensor} or a store's state)
            self.feedback.memory.load_state_dict(state["errors"])

    def bits(self, num_params: int) -> Bits:
        """Down: the dense global model. Up, as fedagg's upload channel counts it: sign sends one bit per entry
        and the 32-bit scale; top-k sends each kept entry's 32-bit value and its index (ceil(log2 P) bits)."""
        return Bits(down=dense(num_params), up=self.stage.bits_up(num_params))
