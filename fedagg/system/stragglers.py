"""`system=stragglers` (FedNova's experiments, FedProx's Sec. 5.2).

Each round ⌊fraction · K⌋ of the K sampled clients, drawn from the stream
(seed, "stragglers", round), lag. How much a straggler manages (`work`):
- `steps` (FedNova's experiments, the default): U{1, ..., its full budget} local steps;
- `epochs_code`: x whole local epochs, x ~ U{1, ..., E−1}, as FedProx's code draws it
  (`np.random.randint(low=1, high=num_epochs)`, high exclusive);
- `epochs_text`: x ~ U{1, ..., E}, as FedProx's text (Sec. 5.2) says.
A straggler trains on the first batches of its usual batch plan, so x epochs are the first
x · ⌈n/B⌉ steps. What the server does with it (`partial_work`): `keep` aggregates the
straggler's partial model (FedProx); `drop` leaves it out of the round (FedProx's FedAvg,
"simply drop the slow devices"): it was sent the model and sends nothing back, like a
`system=dropout` client. The same clients lag under either choice, so the two are paired.
"""

from __future__ import annotations

from typing import Literal

import torch

from fedagg.config.constraints import checked
from fedagg.seeding import generator
from fedagg.system.base import Probability, System

Work = Literal["steps", "epochs_code", "epochs_text"]
PartialWork = Literal["keep", "drop"]


class Stragglers(System):
    @checked("system.")
    def __init__(self, fraction: Probability = 0.5, work: Work = "steps", partial_work: PartialWork = "keep") -> None:
        self.fraction, self.work, self.partial_work = float(fraction), work, partial_work

    def _draw(self, seed: int, round: int, num: int) -> tuple[list[int], list[float]]:
        """Positions of the lagging clients among `num`, and one uniform draw per client (used by those lagging).
        `reporting` and `budgets` draw the same, so `drop` and `keep` pick the same stragglers."""
        g = generator(seed, "stragglers", round)
        lagging = torch.randperm(num, generator=g)[: int(self.fraction * num)].tolist()
        return lagging, torch.rand(num, generator=g).tolist()

    def reporting(self, seed: int, round: int, sampled: list[int]) -> list[int]:
        if self.partial_work == "keep":
            return sampled
        lagging = set(self._draw(seed, round, len(sampled))[0])
        return [i for k, i in enumerate(sampled) if k not in lagging]

    def check(self, local_epochs: int) -> None:
        if self.partial_work == "keep" and self.work == "epochs_code" and local_epochs < 2:
            raise ValueError(f"system.work=epochs_code is not allowed with client.local_epochs={local_epochs}; "
                             "FedProx's code draws a straggler's epochs from 1..E-1, so it needs E >= 2 (or use "
                             "epochs_text)")

    def budgets(self, seed: int, round: int, ids: list[int], full: list[int], epochs: int = 1) -> list[int] | None:
        if self.partial_work == "drop":
            return None  # the stragglers never reach the server; those who report work in full
        self.check(epochs)  # a caller that skipped the assembly's check
        lagging, draws = self._draw(seed, round, len(ids))
        budgets = list(full)
        for k in lagging:
            budgets[k] = self._lagging_steps(draws[k], full[k], epochs)
        return budgets

    def _lagging_steps(self, u: float, full: int, epochs: int) -> int:
        if self.work == "steps":
            return 1 + int(u * full)  # uniform in 1 .. full
        per_epoch = full // epochs  # a full budget is E · ⌈n/B⌉ steps (fedagg.clients.batches.num_steps)
        top = epochs - 1 if self.work == "epochs_code" else epochs
        return per_epoch * (1 + int(u * top))  # x uniform in 1 .. top whole epochs
