"""FedBuff (Nguyen et al., AISTATS 2022, "Federated Learning with Buffered Asynchronous Aggregation"):
`conf/aggregator/fedbuff.yaml`.

The server buffers arrivals; each Δ_i is against the server version it started from (fedagg's sign: the trained
model minus its start, so the paper's x_start − x_end is −Δ_i) and is weighted s(τ_i) = 1/√(1 + τ_i), τ_i the
server steps since it started (Algorithm 1; `staleness: polynomial`, a = 0.5). After `buffer_size` K arrivals
the server steps on
    Δ̄ = (1/K) Σ_i s(τ_i) Δ_i :   w <- w + η_g Δ̄           (optimizer: sgd; the paper's w − η_g Δ̄ in its sign)
or hands Δ̄ to a FedOpt server optimizer (`optimizer: avgm | adam | yogi | adagrad`, fedagg.aggregators.fedopt,
with their own options: `momentum`; `beta1`, `beta2`, `tau`). Each of these options, and `lr`, defaults to null: the
chosen optimizer's own default (lr 1 for sgd, the paper's η_g, and for avgm; 0.01 for adam, yogi and adagrad, as
`aggregator=fedadam`: an adaptive step moves every coordinate by about lr, so sgd's lr = 1 would make it diverge).
One the chosen optimizer does not read is noted at the start. With K = C clients that are all equally fast, every
τ is 0 and the step is FedAvg's with uniform weights (and the same server optimizer).

`form: flsim` is FLSim's FedBuffAggregator (facebookresearch/FLSim@7311f2d): the reducer sums, without dividing
by K (`ReductionType.WEIGHTED_SUM`, flsim/optimizers/async_aggregators.py:519-521, reduce in
flsim/reducers/base_round_reducer.py:173-224), weights that are normalised at `avg_staleness`,
s(τ)/s(avg_staleness) (flsim/utils/async_trainer/async_staleness_weights.py:39-42, polynomial :102-105), and
torch's SGD steps on that sum (async_aggregators.py:421-426, 482-494):
    w <- w + η Σ_i s(τ_i)/s(avg_staleness) Δ_i,
which is the paper's step with η_g = η K / s(avg_staleness) (docs/methods.md). Weights in weights.csv are
s(τ_i) / Σ_j s(τ_j): the arrivals' shares of the step. With `form: flsim` the server optimizers are FLSim's
(create_optimizer_for_async_aggregator, async_aggregators.py:482-509): `avgm` is torch's SGD with momentum
(fedagg's FedAvgM is that step), `adam` torch's Adam with FLSim's FedAdamFedBuffAggregatorConfig (:561-568):
bias-corrected, `eps` beside the corrected √v, L2 `weight_decay` added to the gradient; FLSim has no Yogi or
Adagrad server, so those pairs are refused. FLSim's trainer also drops arrivals staler than `max_staleness`
(async_trainer.py:164-165; null: none dropped) and, at each of its epochs' ends (every client once: N arrivals),
steps on a partly filled buffer (`flush_partial`, async_aggregators.py:406-419); both off by default.
 With `form: flsim` and `optimizer: adam`, null
options are torch Adam's own (lr 0.01 as above, betas 0.9 and 0.999).
"""

from __future__ import annotations

import logging
import math
from typing import Annotated, Literal

import torch
from torch import Tensor

from fedagg.aggregators.asynchronous import (AsyncAggregator, BufferSize, NonNegative, StalenessFunction,
                                             staleness_weight)
from fedagg.aggregators.fedopt import AVGM_MOMENTUM, SERVER_LR, TAU, Beta, FedAdagrad, FedAdam, FedAvgM, FedYogi, Tau
from fedagg.aggregators.inputs import ClientSetup, RoundInputs
from fedagg.config.constraints import Flag, Range, checked

OPTIMIZERS = {"avgm": FedAvgM, "adam": FedAdam, "yogi": FedYogi, "adagrad": FedAdagrad}
# the options each server optimizer reads (FedAdagrad's beta2 only with bias correction, which FedBuff never asks for)
READS = {"sgd": (), "avgm": ("momentum",), "adam": ("beta1", "beta2", "tau"), "yogi": ("beta1", "beta2", "tau"),
         "adagrad": ("beta1", "tau")}
FLSIM_ADAM_READS = ("beta1", "beta2")  # with eps and weight_decay; no tau
ADAPTIVE_LR = 0.01  # aggregator=fedadam's lr, the adaptive optimizers' own here
LR_WORDS = "it must be > 0, or null for the optimizer's own (sgd, avgm: 1.0; adam, yogi, adagrad: 0.01)"
BETA, TAU_RANGE = Beta.__metadata__[0], Tau.__metadata__[0]  # the optimizers' own ranges; null: their defaults
log = logging.getLogger("fedagg")
FLSIM_OPTIMIZERS = ("sgd", "avgm", "adam")  # FLSim's FedBuff servers: torch SGD (with momentum) and torch Adam


class FLSimAdam:
    """FLSim's FedAdam server step: torch.optim.Adam on the gradient FLSim sets, its buffered sum of
    before − after (fedagg's −update), so w ← w − Adam(−update + weight_decay · w)."""

    def __init__(self, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
        self.options = dict(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
        self.param: torch.nn.Parameter | None = None
        self.optimizer: torch.optim.Adam | None = None
        self.pending: dict | None = None  # a resumed optimizer state, loaded once the parameter exists

    def server_update(self, inputs: RoundInputs, update: Tensor) -> Tensor:
        if self.param is None:
            self.param = torch.nn.Parameter(inputs.global_params.detach().clone())
            self.optimizer = torch.optim.Adam([self.param], **self.options)
            if self.pending is not None:
                self.optimizer.load_state_dict(self.pending)
                self.pending = None
        with torch.no_grad():
            self.param.copy_(inputs.global_params)
        self.param.grad = -update  # FLSim's delta: the start minus the trained model
        self.optimizer.step()
        return self.param.detach().clone()

    def state_dict(self) -> dict:
        return self.pending if self.optimizer is None else self.optimizer.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        if state is None:
            return
        if self.optimizer is None:
            self.pending = state
        else:
            self.optimizer.load_state_dict(state)


class FedBuff(AsyncAggregator):

    @checked("aggregator.")
    def __init__(self, buffer_size: BufferSize = 10,
                 lr: Annotated[float | None, Range(gt=0, words=LR_WORDS), SERVER_LR] = None,
                 optimizer: Literal["sgd", "avgm", "adam", "yogi", "adagrad"] = "sgd",
                 momentum: Annotated[float | None, BETA, AVGM_MOMENTUM] = None,
                 beta1: Annotated[float | None, BETA] = None, beta2: Annotated[float | None, BETA] = None,
                 tau: Annotated[float | None, TAU_RANGE, TAU] = None,
                 staleness: StalenessFunction = "polynomial", a: NonNegative = 0.5, b: NonNegative = 4.0,
                 form: Literal["paper", "flsim"] = "paper",
                 avg_staleness: Annotated[int, Range(ge=0, integer=True)] = 1,
                 eps: Annotated[float, Range(ge=0, words="it must be >= 0")] = 1e-8,
                 weight_decay: Annotated[float, Range(ge=0, words="it must be >= 0")] = 1e-5,
                 max_staleness: Annotated[int | None, Range(ge=0, integer=True, words="it must be an integer >= 0, "
                                                            "or null for no cap")] = None,
                 flush_partial: Annotated[bool, Flag()] = False) -> None:
        super().__init__("uniform")
        self.buffer_size, self.optimizer = int(buffer_size), optimizer
        self.lr = 1.0 if lr is None else float(lr)  # sgd's η_g (the optimizers below take theirs)
        self.staleness, self.a, self.b, self.form, self.avg_staleness = staleness, float(a), float(b), form, avg_staleness
        # FLSim's trainer options (the driver applies them, fedagg.loop.asynchronous): off by default, as in the paper
        self.max_staleness = math.inf if max_staleness is None else int(max_staleness)
        self.flush_partial = bool(flush_partial)
        if form == "flsim" and optimizer not in FLSIM_OPTIMIZERS:
            raise ValueError(f"aggregator.optimizer={optimizer!r} is not allowed with aggregator.form=flsim; FLSim's "
                             f"FedBuff servers are {', '.join(FLSIM_OPTIMIZERS)} (form=paper has yogi and adagrad)")
        flsim_adam = form == "flsim" and optimizer == "adam"
        reads = FLSIM_ADAM_READS if flsim_adam else READS[optimizer]
        given = {"momentum": momentum, "beta1": beta1, "beta2": beta2, "tau": tau}
        # set, but not read by this optimizer: noted at the start
        self.unread = {k: v for k, v in given.items() if v is not None and k not in reads}
        self.server = None  # sgd: w + lr Δ̄ here; else the FedOpt rule that steps on Δ̄
        if flsim_adam:  # torch Adam's own defaults where null
            self.server = FLSimAdam(ADAPTIVE_LR if lr is None else float(lr), 0.9 if beta1 is None else float(beta1),
                                    0.999 if beta2 is None else float(beta2), float(eps), float(weight_decay))
        elif optimizer != "sgd":
            options = {k: v for k, v in {"lr": lr, **given}.items() if v is not None and (k == "lr" or k in READS[optimizer])}
            self.server = OPTIMIZERS[optimizer](**options)

    def check_clients(self, setup: ClientSetup) -> None:
        super().check_clients(setup)
        if self.unread:  # legal, but the chosen optimizer never reads them
            readers = {k: [o for o, keys in READS.items() if k in keys] for k in self.unread}
            log.warning("%s %s nothing with aggregator.optimizer=%s (%s)",
                        " and ".join(f"aggregator.{k}={v!r}" for k, v in self.unread.items()),
                        "does" if len(self.unread) == 1 else "do", self.optimizer,
                        "; ".join(f"{k} is read by optimizer={', '.join(r)}" for k, r in readers.items()))

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
