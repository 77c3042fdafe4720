"""Accuracy- and distance-weighted averaging (Fu & Lai).

ABAVG (eq. 2) favours clients whose trained model validates well, ACC_inverse (eq. 3,
Salmeron et al.) favours the ones that validate badly, and IDA (eq. 4-5, Yeganeh et al.)
down-weights models far from the average. All three are convex combinations of the client
models; only the weights differ. They keep no state between rounds.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from torch import Tensor

from fedagg.aggregators.base import Aggregator
from fedagg.aggregators.inputs import Needs, RoundInputs, ValSource
from fedagg.config.constraints import Range, checked

ServerValSize = Annotated[int, Range(ge=1, integer=True, words="use a positive integer")]
Eps = Annotated[float, Range(gt=0, words="use a positive number such as 1e-8")]


def _normalise(scores: Tensor) -> Tensor:
    """scores / sum, or uniform when every score is 0 (no client is preferred)."""
    total = scores.sum()
    return torch.where(total > 0, scores / torch.where(total > 0, total, 1.0), 1.0 / scores.numel())


class AccuracyWeighted(Aggregator):
    """Shared plumbing: weights come from val_acc [K], measured where `val_source` says.

    With `val_source: server` the round loop holds `server_val_size` training samples out
    of every client for the server's validation split; with `local` each client validates
    on its own held-out `client.val_frac`.
    """

    @checked("aggregator.")
    def __init__(self, val_source: ValSource = "local", server_val_size: ServerValSize = 500) -> None:
        super().__init__()
        self.needs = Needs(val_acc=val_source, server_samples=server_val_size if val_source == "server" else 0)

    def client_weights(self, inputs: RoundInputs) -> Tensor:
        return self.weights_from_accuracy(inputs.need("val_acc").to(inputs.client_params.dtype))

    def weights_from_accuracy(self, acc: Tensor) -> Tensor:
        raise NotImplementedError


class ABAVG(AccuracyWeighted):
    """`conf/aggregator/abavg.yaml`: p_k = acc_k / sum_j acc_j (eq. 2); all accuracies 0 -> uniform."""

    def weights_from_accuracy(self, acc: Tensor) -> Tensor:
        return _normalise(acc)  # eq. 2


class AccInverse(AccuracyWeighted):
    """`conf/aggregator/acc_inverse.yaml`: p_k proportional to 1 / max(acc_k, eps) (eq. 3)."""

    @checked("aggregator.")
    def __init__(self, val_source: ValSource = "local", server_val_size: ServerValSize = 500, eps: Eps = 1e-8) -> None:
        super().__init__(val_source, server_val_size)
        self.eps = float(eps)

    def weights_from_accuracy(self, acc: Tensor) -> Tensor:
        inverse = 1.0 / acc.clamp_min(self.eps)  # eps: a client that got nothing right
        return inverse / inverse.sum()  # eq. 3


class IDA(Aggregator):
    """`conf/aggregator/ida.yaml`: p_k proportional to 1 / (||ref - W_k|| + eps) (eq. 4-5).

    ref is the plain mean of the client models (the paper) or the global model (`reference: global`).
    """

    @checked("aggregator.")
    def __init__(self, reference: Literal["mean", "global"] = "mean", eps: Eps = 1e-8) -> None:
        super().__init__()
        self.reference = reference
        self.eps = float(eps)

    def client_weights(self, inputs: RoundInputs) -> Tensor:
        W = inputs.client_params
        ref = W.mean(dim=0) if self.reference == "mean" else inputs.global_params
        d = torch.linalg.vector_norm(ref - W, dim=1)  # ||w_avg - w_k||, eq. 4
        inverse = 1.0 / (d + self.eps)
        # eq. 5 (Z normalises); every model at the reference: nobody is an outlier, so uniform
        return torch.where(d.max() > 0, inverse / inverse.sum(), 1.0 / d.numel())
