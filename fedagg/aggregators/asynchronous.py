"""Rules of an asynchronous server (`server=async`; the driver is fedagg.loop.asynchronous).

The server keeps C clients in flight on the simulated clock; each arrival's update is against the server version
it started from (`inputs.start_params` [K, P]) and `inputs.staleness` [K] says how many server steps were taken
since. A rule declares how many arrivals one server step
takes (`buffer_size`: 1 for FedAsync, K for FedBuff); the driver hands it that many, in arrival order, and one
`aggregate` call is one server version. Everything else is the synchronous contract: `AggregateResult` with the
new parameters, a weight per arrival (weights.csv) and the step's diagnostics.

Staleness functions s(k) of FedAsync (Xie, Koyejo, Gupta 2019, §5), also FedBuff's weight (1/√(1+k) is the
polynomial one with a = 0.5), as in the authors' code (xcgoner/async_fl@912ecf3
train_cifar10_mxnet_fedasync_singlethread_impl.py:258-280, `power` and `hinge`):
    constant    s(k) = 1
    polynomial  s(k) = (k + 1)^(-a)
    hinge       s(k) = 1 if k <= b else 1 / (a (k - b) + 1)
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal

import torch
from torch import Tensor

from fedagg.aggregators.base import Aggregator
from fedagg.config.constraints import Range

StalenessFunction = Literal["constant", "polynomial", "hinge"]
NonNegative = Annotated[float, Range(ge=0, finite=True)]
BufferSize = Annotated[int, Range(ge=1, integer=True)]


def staleness_weight(kind: str, staleness: Tensor, a: float, b: float) -> Tensor:
    """[K] float64 s(k) of each arrival's staleness k ([K], server steps since its start)."""
    k = staleness.to(torch.float64)
    if kind == "constant":
        return torch.ones_like(k)
    if kind == "polynomial":
        return (k + 1) ** (-a)
    if kind == "hinge":
        return torch.where(k <= b, torch.ones_like(k), 1 / (a * (k - b) + 1))
    raise ValueError(f"staleness={kind!r} is not allowed; choose one of constant, polynomial, hinge")


class AsyncAggregator(Aggregator):
    """A rule of `server=async`; `buffer_size` arrivals make one server step. `max_staleness`: the driver drops an
    arrival staler than that (FLSim's trainer, flsim/trainers/async_trainer.py:164-165; ∞: every arrival is used).
    `flush_partial`: after every N arrivals (FLSim's epoch, every client once) a partly filled buffer makes a server
    step too (FLSim's FedBuffAggregator.on_training_epoch_end, flsim/optimizers/async_aggregators.py:406-419)."""

    asynchronous: ClassVar[bool] = True
    buffer_size: int = 1
    max_staleness: float = math.inf
    flush_partial: bool = False

    def staleness_of(self, inputs) -> Tensor:
        """[K] the arrivals' staleness, which the asynchronous driver always gives."""
        return inputs.need("staleness")
