"""`system=none`: every sampled client is online, takes its full local budget and reports.

A system model answers three questions each round, each from its own seeded stream of
(seed, round), so that two runs differing only in the aggregator see the same clients lag
and vanish (DESIGN principle 6): which clients can be sampled (`online`), which of the
sampled ones report back (`reporting`), and how many local steps each takes (`budgets`).
The loop applies the first two; the engines run the budgets as part of local training.
"""

from __future__ import annotations

from torch import Tensor


def probability(key: str, value, *, below_one: bool = False) -> float:
    """A setting in [0, 1] (or [0, 1)), refused with its key and the allowed range."""
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if not (number and 0 <= value <= 1 and not (below_one and value == 1)):
        allowed = "[0, 1)" if below_one else "[0, 1]"
        raise ValueError(f"system.{key}={value!r} is not allowed; it must be a number in {allowed}")
    return float(value)


class System:
    """No system heterogeneity (the default)."""

    def online(self, seed: int, round: int, num_clients: int) -> Tensor | None:
        """[num_clients] bool: who can be sampled this round (None: everyone)."""
        return None

    def reporting(self, seed: int, round: int, sampled: list[int]) -> list[int]:
        """The sampled client ids whose update reaches the server, in the order given."""
        return sampled

    def budgets(self, seed: int, round: int, ids: list[int], full: list[int]) -> list[int] | None:
        """Local steps each client takes (None: every one its full `full[k]` steps)."""
        return None
