"""The privacy accountant of `channel=dp`: every round's own release, composed as it happens.

A round releases one Poisson-subsampled Gaussian mechanism (Mironov et al. 2019): rate q_r (the
chance a client that can be sampled is sampled that round) and noise multiplier z_r (with adaptive
clipping it depends on that round's number of reporters). Rounds differ, so each is composed as its
own event; composing the latest event `rounds` times would let ε fall when a round had more noise.

The sum of the rounds' RDP curves is kept, one addition a round, so a long run costs no more per
round than a short one; each distinct (q, z) is computed once by dp-accounting's `RdpAccountant`
and added in round order, which is what the accountant's own `compose` does, so a checkpoint that
keeps the (q, z) list rebuilds the same sum, bit for bit. A round without noise (z = 0) makes ε
infinite from then on; so it stays.
"""

from __future__ import annotations

import logging
import math

import numpy as np


class _AccountantNotes(logging.Filter):
    """dp-accounting logs, through absl, a warning each time a fractional RDP order does not converge
    (8 a round at q = 0.5): that order is left out of the minimum, which can only make ε larger, never
    wrong; the user has nothing to act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "dp_accounting" not in record.pathname


_NOTES = _AccountantNotes()


def _library():
    from dp_accounting import dp_event  # optional (`fedagg[dp]`): DP.check refuses a run without it
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    absl = logging.getLogger("absl")
    if _NOTES not in absl.filters:
        absl.addFilter(_NOTES)
    return dp_event, rdp


def round_rdp(q: float, z: float) -> np.ndarray:
    """The RDP curve (at the accountant's orders) of one round: Poisson sampling at rate q, Gaussian noise z > 0."""
    dp_event, rdp = _library()
    one = rdp.RdpAccountant()
    one.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)))
    return one.rdp


class Accountant:
    def __init__(self, events: list[tuple[float, float]] | None = None) -> None:
        self.events: list[tuple[float, float]] = []  # (q, z) of every round so far, in order
        self.total: np.ndarray | None = None  # the sum of their RDP curves
        self.infinite = False  # a round without noise
        self._curves: dict[tuple[float, float], np.ndarray] = {}
        for q, z in events or []:
            self.compose(q, z)

    def compose(self, q: float, z: float) -> None:
        q, z = float(q), float(z)
        self.events.append((q, z))
        if z == 0:
            self.infinite = True
        if self.infinite:
            return
        if (q, z) not in self._curves:
            self._curves[q, z] = round_rdp(q, z)
        curve = self._curves[q, z]
        self.total = curve.copy() if self.total is None else self.total + curve

    def epsilon(self, delta: float) -> float:
        """ε at δ of every round so far (0 before the first, inf once a round had no noise)."""
        if self.infinite:
            return math.inf
        if self.total is None:
            return 0.0
        _, rdp = _library()
        return float(rdp.compute_epsilon(rdp.RdpAccountant().orders, self.total, delta)[0])

    def __len__(self) -> int:
        return len(self.events)


def epsilon(q: float, noise_multiplier: float, rounds: int, delta: float) -> float:
    """ε of `rounds` equal rounds (rate q, noise multiplier z)."""
    return Accountant([(q, noise_multiplier)] * rounds).epsilon(delta)
