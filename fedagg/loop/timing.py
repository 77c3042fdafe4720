"""Synchronous rounds on the simulated clock (`clock` group).

A round's reporting clients each arrive `Clock.duration(k, their step budget, the bits they send up, round)`
seconds after the round starts. The round ends when the last of them arrives or, with `clock.deadline`, at the
deadline: clients that would arrive later are dropped before they train (like a `system=dropout` client, they
were sent the model and send nothing back) and counted (`clients_late`). When some sampled client never arrives
by the deadline (late, or dropped out by the system), the server cannot know that before the deadline, and the
round lasts the whole deadline; otherwise it lasts until its last arrival. Over-selection (`clock.over_select`)
is in the sampling: ⌈(1 + o)K⌉ clients instead of K, every one arriving in time aggregated.

`RoundTimes` keeps the run's totals: simulated seconds and client updates aggregated (metrics.csv's
`sim_time` and `client_updates`, written only when a clock is set), and resumes them from a checkpoint.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fedagg.system.clock import Clock

log = logging.getLogger(__name__)


@dataclass
class Timed:
    """A round's reporting clients as the clock leaves them: those that arrive in time, their step budgets (None:
    every one its full budget), the round's simulated seconds and how many were late."""

    ids: list[int]
    budgets: list[int] | None
    seconds: float
    late: int


class RoundTimes:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.sim_time, self.client_updates, self.late = 0.0, 0, 0

    @property
    def enabled(self) -> bool:
        return self.clock.enabled

    def sampled(self, per_round: int) -> int | None:
        """How many clients a round samples (None: K, as without a clock)."""
        return self.clock.selected(per_round) if self.enabled else None

    def cut(self, round: int, sampled: int, ids: list[int], budgets: list[int] | None, full: list[int],
            bits_up: list[int]) -> Timed:
        """The round's arrivals: who of the reporting `ids` (of `sampled` sent the model) arrive by the deadline,
        after `budgets` steps each (None: `full`), each sending its `bits_up` bits; the round's length."""
        clock = self.clock
        steps = budgets if budgets is not None else full
        arrivals = [clock.duration(i, s, b, round) for i, s, b in zip(ids, steps, bits_up)]
        if clock.deadline is None:
            return Timed(ids, budgets, max(arrivals, default=0.0), 0)
        keep = [k for k, t in enumerate(arrivals) if t <= clock.deadline]
        missing = sampled - len(keep)  # late, or never reporting: the server waits for them until the deadline
        seconds = clock.deadline if missing else max(arrivals, default=0.0)
        return Timed([ids[k] for k in keep], None if budgets is None else [budgets[k] for k in keep], seconds,
                     len(ids) - len(keep))

    def add(self, timed: Timed, aggregated: int) -> dict:
        """The round's time and updates into the totals; the round's metrics columns."""
        self.sim_time += timed.seconds
        self.client_updates += aggregated
        self.late += timed.late
        row = {"sim_time": self.sim_time, "client_updates": self.client_updates}
        if self.clock.deadline is not None:
            row["clients_late"] = timed.late
        return row

    def summary(self) -> dict:
        values = {"final_sim_time": self.sim_time, "client_updates": self.client_updates}
        if self.clock.deadline is not None:
            values["clients_late"] = self.late
        return values

    def state_dict(self) -> dict:
        return {"sim_time": self.sim_time, "client_updates": self.client_updates, "late": self.late,
                "clock": self.clock.state_dict()}

    def load_state_dict(self, state: dict | None) -> None:
        if not self.enabled:
            return
        if state is None:
            raise ValueError("resume=true cannot continue this run on the clock: its checkpoint holds no simulated "
                             "time (it was written with clock=none); resume with clock=none or start a new run")
        self.sim_time, self.client_updates, self.late = state["sim_time"], state["client_updates"], state["late"]
        self.clock.load_state_dict(state["clock"])
