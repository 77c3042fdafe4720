"""`system=none`: every sampled client is online, takes its full local budget and reports.

A system model answers three questions each round, each from its own seeded stream of
(seed, round), so that two runs differing only in the aggregator see the same clients lag
and vanish (DESIGN principle 6): which clients can be sampled (`online`), which of the
sampled ones report back (`reporting`), and how many local steps each takes (`budgets`).
The loop applies the first two; the engines run the budgets as part of local training.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from torch import Tensor

from fedagg.config.constraints import Range

Probability = Annotated[float, Range(ge=0, le=1, words="it must be a number in [0, 1]")]
BelowOne = Annotated[float, Range(ge=0, lt=1, words="it must be a number in [0, 1)")]


class System:
    """No system heterogeneity (the default)."""

    takes_clients_offline: ClassVar[bool] = False  # True: `online` leaves some clients out of a round's sampling

    def check(self, local_epochs: int) -> None:
        """Refuse, in one line, a client budget it cannot model; the assembly calls it before anything is
        loaded or written, so that no round finds out."""

    def online(self, seed: int, round: int, num_clients: int) -> Tensor | None:
        """[num_clients] bool: who can be sampled this round (None: everyone)."""
        return None

    def reporting(self, seed: int, round: int, sampled: list[int]) -> list[int]:
        """The sampled client ids whose update reaches the server, in the order given."""
        return sampled

    def budgets(self, seed: int, round: int, ids: list[int], full: list[int], epochs: int = 1) -> list[int] | None:
        """Local steps each client takes (None: every one its full `full[k]` steps, which are `epochs` local
        epochs)."""
        return None
