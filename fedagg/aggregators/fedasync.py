"""FedAsync (Xie, Koyejo, Gupta 2019, "Asynchronous Federated Optimization"): `conf/aggregator/fedasync.yaml`.

Each arrival is a server step: x_new trained from server version tau arrives at version t, and
    alpha_t = alpha * s(t - tau),    w <- (1 - alpha_t) w + alpha_t x_new
with s a staleness function (fedagg.aggregators.asynchronous): the authors' code mixes exactly so,
`weight[:] = param_server * (1-alpha_scaled) + weight * alpha_scaled` (xcgoner/async_fl@912ecf3
train_cifar10_mxnet_fedasync_singlethread_impl.py:281-284). The mix is of the models themselves, against the
current w, not of the update against the client's start.

Defaults: alpha = 0.6, polynomial a = 0.5, hinge a = 10, b = 4 are read from secondary sources, not from
the paper or the authors' code; the authors' one script (experiment_script_1.sh) runs alpha = 0.8 with the
constant function (it passes no --alpha-type) and halves alpha at epoch 800 of 2000 (`--alpha-decay 0.5
--alpha-decay-epoch 800`), which is not done here. Their code simulates staleness by drawing the start model
uniformly among the last `max_delay` versions (lines 211-228); here the simulated clock makes it. The client's
proximal term (rho/2)||x - x_tau||^2 is the client objective `fedprox`. BatchNorm statistics are mixed as the
parameters are (the code mixes every array of `net.collect_params()`, running statistics included).
"""

from __future__ import annotations

import logging
from typing import Annotated

import torch

from fedagg.aggregators.asynchronous import AsyncAggregator, NonNegative, StalenessFunction, staleness_weight
from fedagg.aggregators.base import AggregateResult
from fedagg.aggregators.inputs import Needs, RoundInputs
from fedagg.config.constraints import Range, checked

DEFAULT_A = {"constant": 0.0, "polynomial": 0.5, "hinge": 10.0}
log = logging.getLogger("fedagg")


class FedAsync(AsyncAggregator):
    buffer_size = 1
    needs = Needs(buffers=True)  # the statistics are mixed with the global ones

    @checked("aggregator.")
    def __init__(self, alpha: Annotated[float, Range(gt=0, le=1, words="it must be a mixing weight in (0, 1]")] = 0.6,
                 staleness: StalenessFunction = "polynomial",
                 a: Annotated[float | None, Range(ge=0, finite=True, words="it must be a finite number >= 0, or "
                                                  "null for the function's default (polynomial 0.5, hinge 10)")] = None,
                 b: NonNegative = 4.0) -> None:
        super().__init__("uniform")
        self.alpha, self.staleness = float(alpha), staleness
        self.a = DEFAULT_A[staleness] if a is None else float(a)
        self.b = float(b)
        self.a_unread = a is not None and staleness == "constant"  # noted at the start

    def check_clients(self, setup) -> None:
        super().check_clients(setup)
        if self.a_unread:  # legal, but s(k) = 1 has no parameter
            log.warning("aggregator.a=%r does nothing with aggregator.staleness=constant: s(k) = 1 reads no a; "
                        "polynomial and hinge do", self.a)

    def aggregate(self, inputs: RoundInputs) -> AggregateResult:
        if inputs.num_clients != 1:
            raise ValueError(f"FedAsync steps on one arrival at a time, got {inputs.num_clients}")
        s = staleness_weight(self.staleness, self.staleness_of(inputs), self.a, self.b)
        alpha_t = self.alpha * float(s[0])
        params = inputs.global_params * (1 - alpha_t) + inputs.client_params[0] * alpha_t
        buffers = inputs.need("global_buffers") * (1 - alpha_t) + inputs.need("client_buffers")[0] * alpha_t
        weights = torch.ones(1, dtype=inputs.client_params.dtype, device=params.device)
        return AggregateResult(params, weights, buffers=buffers, metrics={"alpha": alpha_t})
