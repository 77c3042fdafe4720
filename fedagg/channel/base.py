"""The channel: an ordered chain of stages between local training and the aggregator.

A round's participants send Δ_k = W_k − w. The chain runs, in this order: the compressors as
listed (each on what the one before sent, with its own error feedback by client id), then
the corrupted clients' model attack, which replaces what those clients would have sent
through the honest channel, then the privacy stage (clipping and noise) as listed. The
aggregator receives w + (what arrived) for each client. `channel=none` is the empty chain:
the models pass unchanged, bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedagg.channel.errors import ErrorMemory
from fedagg.data.seeding import generator

if TYPE_CHECKING:
    from fedagg.aggregators.base import Aggregator
    from fedagg.clients.store import ClientStore
    from fedagg.attacks.base import Attack


class Stage:
    """A compressor: `compress(u [K, P], g) -> [K, P]` row by row; `bits_up(P)` per client."""

    error_feedback = False
    privatises = False  # True: acts after the attack, on every row (clipping, noise)

    def compress(self, u: Tensor, g: torch.Generator) -> Tensor:
        raise NotImplementedError

    def bits_up(self, num_params: int) -> int | None:
        """What one client uploads after this stage; None: as much as it received."""
        return None

    def check(self, aggregator: Aggregator, num_clients: int, per_round: int) -> None:
        """Refuse, before training, an aggregator this stage is not defined with."""

    def metrics(self) -> dict[str, float]:
        """Per-round values for metrics.csv (and, the latest, summary.json): epsilon, the clipping bound."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class Channel:
    def __init__(self, stages: list[Stage] | None = None, **named: Stage) -> None:
        """`Channel([TopK(), DP()])` from Python; Hydra's `channel=[topk,dp]` passes them by name, in that order."""
        self.stages: list[Stage] = [*(stages or []), *named.values()]
        self.errors = [ErrorMemory() if s.error_feedback else None for s in self.stages]

    @classmethod
    def of(cls, value: Channel | list[Stage] | None) -> Channel:
        return value if isinstance(value, Channel) else cls(value)

    def check(self, aggregator: Aggregator, num_clients: int, per_round: int) -> None:
        for s in self.stages:
            s.check(aggregator, num_clients, per_round)

    def bits_up(self, num_params: int) -> int | None:
        """Bits one client uploads: the last compressor's count; None (the aggregator's own) without one."""
        counts = [s.bits_up(num_params) for s in self.stages if s.bits_up(num_params) is not None]
        return counts[-1] if counts else None

    def transmit(self, global_params: Tensor, client_params: Tensor, ids: list[int], corrupted: Tensor,
                 attack: Attack, seed: int, round: int) -> Tensor:
        """What the aggregator receives [K, P] from the round's clients `ids` (`corrupted` [K] marks attackers).
        Stages that are absent leave the models as they are, bit for bit."""
        models = client_params
        compressors = [(n, s, m) for n, (s, m) in enumerate(zip(self.stages, self.errors)) if not s.privatises]
        if compressors:
            sent = models - global_params  # Δ_k
            for n, stage, memory in compressors:
                g = generator(seed, "channel", n, round)
                if memory is None:
                    sent = stage.compress(sent, g)
                    continue
                u = sent + torch.stack([memory.get(i, global_params) for i in ids])  # u = e_k + Δ_k
                sent = stage.compress(u, g)
                for i, e in zip(ids, u - sent):
                    memory.put(i, e)  # e_k ← u − C(u)
            models = global_params + sent
        if bool(corrupted.any()):  # the attack replaces what the honest channel would have sent
            models = attack.corrupt(global_params, models, corrupted, generator(seed, "attack", round))
        private = [(n, s) for n, s in enumerate(self.stages) if s.privatises]
        if private:
            sent = models - global_params
            for n, stage in private:
                sent = stage.compress(sent, generator(seed, "channel", n, round))
            models = global_params + sent
        return models

    def metrics(self) -> dict[str, float]:
        return {k: v for s in self.stages for k, v in s.metrics().items()}

    def client_stores(self) -> dict[str, ClientStore]:
        """Each error-feedback stage's memory by a folder name: the run loop attaches them to the run directory."""
        return {f"channel_{n}_errors": m.rows for n, m in enumerate(self.errors) if m is not None}

    def state_dict(self) -> dict:
        return {"stages": [s.state_dict() for s in self.stages],
                "errors": [None if m is None else m.state_dict() for m in self.errors]}

    def load_state_dict(self, state: dict | None) -> None:
        if state is None:
            return  # a checkpoint from before the channel: nothing was kept
        for s, st in zip(self.stages, state["stages"]):
            s.load_state_dict(st)
        for m, st in zip(self.errors, state["errors"]):
            if m is not None and st is not None:
                m.load_state_dict(st)
