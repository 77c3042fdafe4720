"""FedBuff (Nguyen et al., AISTATS 2022, "Federated Learning with Buffered Asynchronous Aggregation"):
`conf/aggregator/fedbuff.yaml`.

The server buffers arrivals; each Δ_i is against the server version it started from (fedagg's sign: the trained
model minus its start, so the paper's x_start − x_end is −Δ_i) and is weighted s(τ_i) = 1/√(1 + τ_i), τ_i the
server steps since it started (Algorithm 1; `staleness: polynomial`, a = 0.5). After `buffer_size` K arrivals
the server steps on
    Δ̄ = (1/K) Σ_i s(τ_i) Δ_i :   w <- w + η_g Δ̄           (optimizer: sgd; the paper's w − η_g Δ̄ in its sign)
or hands Δ̄ to a FedOpt server optimizer (`optimizer: avgm | adam | yogi | adagrad`, fedagg.aggregators.fedopt,
with their own options: `momentum`; `beta1`, `beta2`, `tau`). With K = C clients that are all equally fast, every
τ is 0 and the step is FedAvg's with uniform weights (and the same server optimizer).

`form: flsim` is FLSim's FedBuffAggregator (facebookresearch/FLSim@7311f2d): the reducer sums, without dividing
by K (`ReductionType.WEIGHTED_SUM`, flsim/optimizers/async_aggregators.py:519-521, reduce in
flsim/reducers/base_round_reducer.py:173-224), weights that are normalised at `avg_staleness`,
s(τ)/s(avg_staleness) (flsim/utils/async_trainer/async_staleness_weights.py:39-42, polynomial :102-105), and
torch's SGD steps on that sum (async_aggregators.py:421-426, 482-494):
    w <- w + η Σ_i s(τ_i)/s(avg_staleness) Δ_i,
which is the paper's step with η_g = η K / s(avg_staleness) (docs/methods.md). Weights in weights.csv are
s(τ_i) / Σ_j s(τ_j): the arrivals' shares of the step.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from torch import Tensor

from fedagg.aggregators.asynchronous import (AsyncAggregator, BufferSize, NonNegative, StalenessFunction,
                                             staleness_weight)
from fedagg.aggregators.fedopt import (AVGM_MOMENTUM, SERVER_LR, TAU, Beta, FedAdagrad, FedAdam, FedAvgM, FedYogi, Rate,
                                      Tau)
from fedagg.aggregators.inputs import RoundInputs
from fedagg.config.constraints import Range, checked

OPTIMIZERS = {"avgm": FedAvgM, "adam": FedAdam, "yogi": FedYogi, "adagrad": FedAdagrad}


class FedBuff(AsyncAggregator):

    @checked("aggregator.")
    def __init__(self, buffer_size: BufferSize = 10, lr: Annotated[Rate, SERVER_LR] = 1.0,
                 optimizer: Literal["sgd", "avgm", "adam", "yogi", "adagrad"] = "sgd",
                 momentum: Annotated[Beta, AVGM_MOMENTUM] = 0.9, beta1: Beta = 0.9, beta2: Beta = 0.99,
                 tau: Annotated[Tau, TAU] = 1e-3,
                 staleness: StalenessFunction = "polynomial", a: NonNegative = 0.5, b: NonNegative = 4.0,
                 form: Literal["paper", "flsim"] = "paper",
                 avg_staleness: Annotated[int, Range(ge=0, integer=True)] = 1) -> None:
        super().__init__("uniform")
        self.buffer_size, self.lr, self.optimizer = int(buffer_size), float(lr), optimizer
        self.staleness, self.a, self.b, self.form, self.avg_staleness = staleness, float(a), float(b), form, avg_staleness
        self.server = None  # sgd: w + lr Δ̄ here; else the FedOpt rule that steps on Δ̄
        if optimizer == "avgm":
            self.server = FedAvgM(lr=lr, momentum=momentum)
        elif optimizer != "sgd":
            self.server = OPTIMIZERS[optimizer](lr=lr, beta1=beta1, beta2=beta2, tau=tau)

    def weights_of(self, inputs: RoundInputs) -> Tensor:
        """[K] float64 s(τ_i) of the buffered arrivals."""
        return staleness_weight(self.staleness, self.staleness_of(inputs), self.a, self.b)

    def client_weights(self, inputs: RoundInputs) -> Tensor:
        s = self.weights_of(inputs)
        return (s / s.sum()).to(inputs.client_params.dtype)

    def server_update(self, inputs: RoundInputs, update: Tensor) -> tuple[Tensor, dict[str, float]]:
        """`update` = Σ p_i Δ_i with p_i = s_i / Σ s: rescaled to the paper's (1/K) Σ s_i Δ_i, or FLSim's sum."""
        s = self.weights_of(inputs)
        if self.form == "paper":
            scale = float(s.sum()) / inputs.num_clients
        else:
            scale = float(s.sum()) / float(staleness_weight(self.staleness, torch.tensor([self.avg_staleness]),
                                                            self.a, self.b)[0])
        mean = update * scale if scale != 1.0 else update
        metrics = {"staleness_weight": float(s.mean())}
        if self.server is None:
            return inputs.global_params + self.lr * mean, metrics
        return self.server.server_update(inputs, mean), metrics

    def state_dict(self) -> dict:
        return {} if self.server is None else {"server": self.server.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.server is not None:
            self.server.load_state_dict(state["server"])
