"""The simulated clock (`clock` group).

`clock=none` (the default) is the base `Clock`: `enabled` is False and a run has no simulated time (its files
are those of a run before the clock existed). Any other option is a `TimedClock`, and a dispatch of client k
that takes `steps` local steps and uploads `bits_up` bits lasts

    duration = steps · step_time(k) · e^{jitter · Z} + bits_up / upload_rate

- step_time(k), seconds per local step, is drawn once per client in `connect`: one uniform u_k ∈ (0, 1) from
  the client's own stream (seed, "clock", k), put through the family's inverse CDF. Sampling, batches and
  systems draw from other streams, so two runs differing only in the aggregator see the same client times
  (DESIGN principle 6); two families of one seed keep each client's rank (the same u_k).
- Z ~ N(0, 1) is drawn per dispatch from the stream (seed, "clock_jitter", k, dispatch), so a resumed run
  draws the same; `jitter: 0` (the default) draws nothing.
- upload_rate in bits per second; 0 or null: uploads take no time.

Simulated times must stay finite numbers (metrics.csv's `sim_time`, summary.json's `final_sim_time`, the
asynchronous server's arrival order): a clock whose slowest client, at the u = 1 − 10⁻¹² quantile and the largest
jitter factor e^{jitter · 9}, would take more than `LONGEST_STEP` seconds per local step is refused when it is
built, in one line, and so is an upload rate below `SLOWEST_RATE`. Z is clamped to ±9 (|Z| > 9 has probability
2·10⁻¹⁹), so the bound holds for every draw; sums of a run's dispatches then stay far below float64's 1.8e308.

The families are FLSim's per-user duration distributions (facebookresearch/FLSim@7311f2d
`flsim/utils/timing/training_duration_distribution.py`): half-normal min + |N(0, σ)| (lines 97-116), uniform
U(min, 2·mean − min) (lines 119-142), exponential with mean `mean` (rate 1/mean, lines 145-171). FLSim draws a
duration per training event; here it is a per-step time drawn once per client, as fedagg's design says. FLSim has no
lognormal; `lognormal` is median · e^{σ N(0, 1)}.

A synchronous round on the clock (`fedagg.loop.round_loop`) ends when its last reporting client arrives, or at
`deadline` seconds: clients arriving later are dropped before they train; `over_select` o samples ⌈(1 + o)K⌉
clients instead of K (fedagg's choice). The drivers of asynchronous rounds use `duration` directly.
"""

from __future__ import annotations

import logging
import math
from statistics import NormalDist
from typing import Annotated, ClassVar

import torch

from fedagg.config.constraints import Range, checked
from fedagg.seeding import generator

LONGEST_STEP = 1e100  # seconds per local step at most: leaves 10^200 for steps x dispatches before float64 overflows
SLOWEST_RATE = 1e-80  # bits per second at least (when set): an upload of 10^13 bits then lasts at most 10^93 s
Z_MAX = 9.0  # the jitter's normal draw is clamped to ±Z_MAX, so LONGEST_STEP bounds every draw
U_TOP = 1 - 1e-12  # the largest u_k a client can draw (`_uniform`)
Positive = Annotated[float, Range(gt=0, finite=True)]
NonNegative = Annotated[float, Range(ge=0, finite=True)]
Rate = Annotated[float, Range(ge=SLOWEST_RATE, also=(0, 0.0), words=f"it must be 0 or null (uploads take no time) "
                                                                      f"or a number of bits per second >= {SLOWEST_RATE:g}")]
Deadline = Annotated[float, Range(gt=0, finite=True, words="it must be a finite number of seconds > 0, or null "
                                                          "for no deadline")]
_NORMAL = NormalDist()
log = logging.getLogger("fedagg")


class Clock:
    """`clock=none`: no simulated time. A loop asks `enabled` and draws nothing; a driver that needs time (the
    asynchronous one) refuses it. Its methods say so rather than return a made-up time."""

    enabled: ClassVar[bool] = False
    deadline: float | None = None
    over_select: float = 0.0

    def connect(self, seed: int, num_clients: int) -> None:
        """Nothing to draw."""

    def check(self, per_round: int, pool: int) -> None:
        """Note, in one line at the start, a setting that does nothing with `per_round` clients a synchronous round
        of the `pool` that can train."""

    def step_time(self, client_id: int) -> float:
        raise RuntimeError("clock=none has no simulated time; choose a clock (clock=lognormal, ...)")

    def duration(self, client_id: int, steps: int, bits_up: int, dispatch: int) -> float:
        raise RuntimeError("clock=none has no simulated time; choose a clock (clock=lognormal, ...)")

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict | None) -> None:
        pass


class TimedClock(Clock):
    """A clock of one family: subclasses give `quantile(u)`, the per-step time at the u-quantile, name in `shape`
    the settings it reads, and call `check_slowest` once they are set."""

    enabled: ClassVar[bool] = True
    shape: ClassVar[tuple[str, ...]] = ()

    def __init__(self, upload_rate: float | None = None, jitter: float = 0.0, deadline: float | None = None,
                 over_select: float = 0.0) -> None:
        self.upload_rate, self.jitter = upload_rate or 0.0, float(jitter)
        self.deadline = None if deadline is None else float(deadline)
        self.over_select = float(over_select)
        if self.over_select > 0 and self.deadline is None:
            raise ValueError(f"clock.over_select={over_select!r} is not allowed with clock.deadline=null; "
                             "over-selection samples extra clients for a deadline to cut: set clock.deadline "
                             "(seconds), or clock.over_select=0")
        self.seed: int | None = None
        self.times: list[float] = []

    def check_slowest(self) -> None:
        """Refuse, in one line, a family and jitter whose slowest client's step exceeds LONGEST_STEP seconds."""
        try:
            slowest = self.quantile(U_TOP)
        except OverflowError:
            slowest = math.inf
        log_slowest = (math.log(slowest) if slowest > 0 else -math.inf) + self.jitter * Z_MAX
        if log_slowest <= math.log(LONGEST_STEP):
            return
        keys = [*self.shape, *(("jitter",) if self.jitter else ())]
        shown = ", ".join(f"clock.{k}={getattr(self, k)!r}" for k in keys)
        lasts = ("more seconds than a float64 holds" if math.isinf(log_slowest)
                 else f"about 1e{log_slowest / math.log(10):+.0f} seconds")
        lower = ", ".join(f"clock.{k}" for k in keys[:-1]) + (" or " if len(keys) > 1 else "") + f"clock.{keys[-1]}"
        raise ValueError(f"{shown} {'are' if len(keys) > 1 else 'is'} not allowed{' together' if len(keys) > 1 else ''}: "
                         f"the slowest client's local step would last {lasts}, and simulated times stay "
                         f"finite only up to {LONGEST_STEP:g} seconds a step; lower {lower}")

    def quantile(self, u: float) -> float:
        raise NotImplementedError

    def connect(self, seed: int, num_clients: int) -> None:
        """Each client's per-step time, from its own stream (seed, "clock", k), once."""
        self.seed = int(seed)
        self.times = [self.quantile(_uniform(seed, k)) for k in range(num_clients)]

    def check(self, per_round: int, pool: int) -> None:
        if not self.over_select or self.selected(per_round) <= pool:
            return
        if per_round >= pool:  # legal, but there is nobody more to sample
            log.warning("clock.over_select=%g does nothing: clients_per_round already sends all %d clients that can "
                        "train each round, so no extra one can be sampled; over-selection needs clients_per_round "
                        "below them", self.over_select, pool)
        else:
            log.warning("clock.over_select=%g asks for ceil((1 + %g) x %d) = %d clients a round, but only %d can train: "
                        "a round samples all %d (clock.over_select=%.3g already samples them all)",
                        self.over_select, self.over_select, per_round, self.selected(per_round), pool, pool,
                        (pool - per_round) / per_round)

    def step_time(self, client_id: int) -> float:
        if self.seed is None:
            raise RuntimeError("the clock is not connected: call connect(seed, num_clients) first")
        return self.times[client_id]

    def duration(self, client_id: int, steps: int, bits_up: int, dispatch: int) -> float:
        """Seconds from dispatch to arrival: local compute (jittered per dispatch), then the upload.
        `dispatch`: any integer naming this dispatch of this client (a synchronous round passes its round)."""
        compute = steps * self.step_time(client_id)
        if self.jitter:
            z = float(torch.randn(1, dtype=torch.float64, generator=generator(self.seed, "clock_jitter", client_id,
                                                                               dispatch)))
            compute *= math.exp(self.jitter * min(max(z, -Z_MAX), Z_MAX))  # clamped: see LONGEST_STEP
        return compute + (bits_up / self.upload_rate if self.upload_rate else 0.0)

    def selected(self, per_round: int) -> int:
        """How many clients a synchronous round samples: ⌈(1 + o)K⌉ (K itself without over-selection)."""
        return math.ceil(round((1 + self.over_select) * per_round, 9)) if self.over_select else per_round


def _uniform(seed: int, client_id: int) -> float:
    """u_k in (0, 1) from client k's own stream; kept off the ends so that no inverse CDF is infinite."""
    u = float(torch.rand(1, dtype=torch.float64, generator=generator(seed, "clock", client_id)))
    return min(max(u, 1e-12), 1 - 1e-12)


class HalfNormal(TimedClock):
    """min + |N(0, σ)| seconds per step (FLSim's PerUserHalfNormalDurationDistribution, lines 97-116)."""

    shape = ("min", "sigma")

    @checked("clock.")
    def __init__(self, min: NonNegative = 0.0, sigma: Positive = 1.0, upload_rate: Rate | None = None,
                 jitter: NonNegative = 0.0, deadline: Deadline | None = None, over_select: NonNegative = 0.0) -> None:
        self.min, self.sigma = float(min), float(sigma)
        super().__init__(upload_rate, jitter, deadline, over_select)
        self.check_slowest()

    def quantile(self, u: float) -> float:
        return self.min + self.sigma * _NORMAL.inv_cdf((1 + u) / 2)  # |N(0, σ)| at u: σ Φ⁻¹((1 + u) / 2)


class LogNormal(TimedClock):
    """median · e^{σ N(0, 1)} seconds per step (not among FLSim's families; fedagg's design lists it)."""

    shape = ("median", "sigma")

    @checked("clock.")
    def __init__(self, median: Positive = 1.0, sigma: Positive = 1.0, upload_rate: Rate | None = None,
                 jitter: NonNegative = 0.0, deadline: Deadline | None = None, over_select: NonNegative = 0.0) -> None:
        self.median, self.sigma = float(median), float(sigma)
        super().__init__(upload_rate, jitter, deadline, over_select)
        self.check_slowest()

    def quantile(self, u: float) -> float:
        return self.median * math.exp(self.sigma * _NORMAL.inv_cdf(u))


class Exponential(TimedClock):
    """Exponential with mean `mean` seconds per step (FLSim's PerUserExponentialDurationDistribution, rate
    1/mean, lines 145-171; its docstring calls the mean a rate, its code takes it as the mean)."""

    shape = ("mean",)

    @checked("clock.")
    def __init__(self, mean: Positive = 1.0, upload_rate: Rate | None = None, jitter: NonNegative = 0.0,
                 deadline: Deadline | None = None, over_select: NonNegative = 0.0) -> None:
        self.mean = float(mean)
        super().__init__(upload_rate, jitter, deadline, over_select)
        self.check_slowest()

    def quantile(self, u: float) -> float:
        return -self.mean * math.log1p(-u)


class Uniform(TimedClock):
    """U(min, 2·mean − min) seconds per step (FLSim's PerUserUniformDurationDistribution, lines 119-142)."""

    shape = ("min", "mean")

    @checked("clock.")
    def __init__(self, min: NonNegative = 0.0, mean: Positive = 1.0, upload_rate: Rate | None = None,
                 jitter: NonNegative = 0.0, deadline: Deadline | None = None, over_select: NonNegative = 0.0) -> None:
        if min > mean:
            raise ValueError(f"clock.min={min!r} is not allowed with clock.mean={mean!r}; the uniform family is "
                             "U(min, 2·mean − min), so min must be at most mean")
        self.min, self.mean = float(min), float(mean)
        super().__init__(upload_rate, jitter, deadline, over_select)
        self.check_slowest()

    def quantile(self, u: float) -> float:
        return self.min + u * 2 * (self.mean - self.min)
