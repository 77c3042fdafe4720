"""The channel: an ordered chain of stages between local training and the aggregator.

A round's participants send Δ_k = W_k − w. The chain runs, in this order: the compressors as
listed (each on what the one before sent, with its own error feedback by client id), then
the corrupted clients' model attack, which replaces what those clients would have sent
through the honest channel, then the privacy stage (clipping and noise) as listed. The
aggregator receives w + (what arrived) for each client. `channel=none` is the empty chain:
the models pass unchanged, bit for bit. The stages run in that order whatever order a list gives
them in, so a list in another order is refused rather than silently reordered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from fedagg.channel.errors import ErrorMemory
from fedagg.data.seeding import generator

if TYPE_CHECKING:
    from fedagg.aggregators.base import Aggregator
    from fedagg.clients.store import ClientStore
    from fedagg.attacks.base import Attack


@dataclass(frozen=True)
class Setup:
    """What the stages check before training: who can take part, and the aggregator as the user chose it."""

    num_clients: int  # N, every client
    per_round: int  # K, the clients sampled a round
    sampleable: int | None = None  # the clients that can be sampled (N less eval.held_out_clients); None: N
    online_varies: bool = False  # a system takes clients offline: a round samples K of those online then
    aggregator: str = ""  # as the user typed it ("aggregator=fedcams"); "": the class's name is shown
    sampler: str = ""  # a sampler whose draw is not uniform, as the user chose it ("sampler=size"); "": uniform

    @property
    def pool(self) -> int:
        return self.num_clients if self.sampleable is None else self.sampleable

    def named(self, aggregator: Aggregator) -> str:
        return self.aggregator or f"aggregator {type(aggregator).__name__}"


class Stage:
    """A compressor: `compress(u [K, P], g) -> [K, P]` row by row; `bits_up(P)` per client. A privatising stage
    (`privatises`) runs after the attack instead, `privatise(u, g, rate)` on the round's rows."""

    error_feedback = False
    privatises = False  # True: acts after the attack, on every row (clipping, noise)
    # True: its noise is scaled for the uniform mean of the updates (the edge picks aggregator.weighting=uniform
    # when the user did not choose a weighting)
    needs_uniform_mean: ClassVar[bool] = False

    def compress(self, u: Tensor, g: torch.Generator) -> Tensor:
        raise NotImplementedError

    def privatise(self, u: Tensor, g: torch.Generator, rate: float | None = None) -> Tensor:
        """The rows a privatising stage releases; `rate`: the round's sampling rate (None: K over the pool)."""
        raise NotImplementedError

    def bits_up(self, num_params: int) -> int | None:
        """What one client uploads after this stage; None: as much as it received."""
        return None

    def check(self, aggregator: Aggregator, setup: Setup) -> None:
        """Refuse, before training, an aggregator this stage is not defined with."""

    def metrics(self) -> dict[str, float]:
        """Per-round values for metrics.csv (and, the latest, summary.json): epsilon, the clipping bound."""
        return {}

    def notes(self) -> list[str]:
        """Lines for the start of the run, once `check` has accepted the setup (what the stage assumes, costs)."""
        return []

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class Channel:
    def __init__(self, stages: list[Stage] | None = None, **named: Stage) -> None:
        """`Channel([TopK(), DP()])` from Python; Hydra's `channel=[topk,dp]` passes them by name, in that order."""
        self.stages: list[Stage] = [*(stages or []), *named.values()]
        self.names = [type(s).__name__.lower() for s in stages or []] + list(named)
        order = [s.privatises for s in self.stages]
        if order != sorted(order):  # a privatising stage before a compressor
            runs = [n for n, s in zip(self.names, self.stages) if not s.privatises]
            runs += [n for n, s in zip(self.names, self.stages) if s.privatises]
            raise ValueError(f"channel={self.shown} is not allowed: the stages run compressors first, then the attack, "
                             f"then {', '.join(n for n, s in zip(self.names, self.stages) if s.privatises)}; write "
                             f"channel=[{','.join(runs)}]")
        self.errors = [ErrorMemory() if s.error_feedback else None for s in self.stages]

    @property
    def shown(self) -> str:
        """The channel as the command line writes it: none, topk, [topk,dp]."""
        return "none" if not self.names else self.names[0] if len(self.names) == 1 else f"[{','.join(self.names)}]"

    @classmethod
    def of(cls, value: Channel | list[Stage] | None) -> Channel:
        return value if isinstance(value, Channel) else cls(value)

    def check(self, aggregator: Aggregator, setup: Setup) -> None:
        if aggregator.compresses_uploads and any(not s.privatises for s in self.stages):
            twin = aggregator.same_uncompressed
            once = f"use {twin} channel={self.shown} to compress once, in the channel, or channel=none" if twin else \
                "use channel=none"
            raise ValueError(f"channel={self.shown} is not allowed with {setup.named(aggregator)}: it compresses every "
                             f"upload itself, so they would be compressed twice; {once}")
        for s in self.stages:
            s.check(aggregator, setup)

    def bits_up(self, num_params: int) -> int | None:
        """Bits one client uploads: the last compressor's count; None (the aggregator's own) without one."""
        counts = [s.bits_up(num_params) for s in self.stages if s.bits_up(num_params) is not None]
        return counts[-1] if counts else None

    def transmit(self, global_params: Tensor, client_params: Tensor, ids: list[int], corrupted: Tensor,
                 attack: Attack, seed: int, round: int, rate: float | None = None) -> Tensor:
        """What the aggregator receives [K, P] from the round's clients `ids` (`corrupted` [K] marks attackers);
        `rate`: the chance a client that could be sampled this round was (for the privacy accountant).
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
                sent = stage.privatise(sent, generator(seed, "channel", n, round), rate)
            models = global_params + sent
        return models

    def metrics(self) -> dict[str, float]:
        return {k: v for s in self.stages for k, v in s.metrics().items()}

    def notes(self) -> list[str]:
        return [note for s in self.stages for note in s.notes()]

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
