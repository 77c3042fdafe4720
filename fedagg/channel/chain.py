"""The channel: a chain of stages between local training and the aggregator, run in list order.

A round's participants send their updates Δ_k (against the model each started from). Every
stage has a client side, run on the round's rows in the order the list gives (`Stage.client`:
the [K, P] rows, with `Upload`, the round's context: client ids, the corrupted mask, seed,
round, the sampling rate); a stage may also have a server side (`Stage.server`), run once on
the aggregated mean update [P] after the aggregator's weighted mean and before its server step
(DP's noise, a compressor's decoding). Server sides run in the reverse of the list order, as a
decoder undoes the encoders it follows: the last client side's server side first, so DP's
noise lands on what DP clipped and a decoding listed before it is post-processing.

The corrupted clients' model attack is a position in the chain (`channel=[attack,topk]`): it
replaces what those clients send at that point, on the models. Where the list does not name it,
it runs after the compressors and before the first privatising stage. A compressor after a
privatising stage is refused: the noise is scaled for the clipped update, which the compressor
would change. Error feedback is a wrapper of any compressor (`ErrorFeedback`, fedagg.channel.
feedback); a compressor whose options say `error_feedback: true` is wrapped by the chain.

`channel=none` is the attack alone: the models pass unchanged, bit for bit. This package imports
nothing from `fedagg.aggregators`: the stages check the aggregator through `Rule`, a plain
description the run's assembly builds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from fedagg.channel.base import AttackPosition, Compressor, Setup, Stage, Upload
from fedagg.channel.feedback import ErrorFeedback

if TYPE_CHECKING:
    from fedagg.attacks.base import Attack
    from fedagg.clients.store import ClientStore


def row_blocks(num_rows: int, block_rows: int | None) -> list[slice]:
    """Row ranges of at most block_rows rows (all of them for None), as the aggregators' blocks cut them."""
    step = num_rows if block_rows is None else max(1, block_rows)
    return [slice(start, min(start + step, num_rows)) for start in range(0, num_rows, step)] or [slice(0, 0)]


def _as(on: str, rows: Tensor, form: str, start: Tensor) -> tuple[Tensor, str]:
    """`rows` in the form a stage works `on` (models, or updates against `start`), and that form."""
    if on == "models" and form == "updates":
        return start + rows, "models"
    if on != "models" and form == "models":
        return rows - start, "updates"
    return rows, form


class ServerSide:
    """The chain's server sides for one round, as one callable on the aggregated mean update [P]
    (`RoundInputs.on_mean`): in reverse list order, each with the stream its client side used."""

    def __init__(self, steps: list[tuple[Stage, torch.Generator]], up: Upload) -> None:
        self.steps, self.up, self.applied = steps, up, False

    @property
    def needed(self) -> bool:
        return bool(self.steps)

    def __call__(self, mean: Tensor) -> Tensor:
        if self.applied:
            raise RuntimeError("the channel's server side was applied twice in one round")
        self.applied = True
        for stage, g in reversed(self.steps):
            mean = stage.server(mean, self.up, g)
        return mean


@dataclass(frozen=True)
class Arrived:
    """What reaches the server: the models [K, P] the aggregator receives, and the server sides for their mean."""

    models: Tensor
    on_mean: Callable[[Tensor], Tensor]


class Channel:
    def __init__(self, stages: list[Stage] | None = None, **named: Stage) -> None:
        """`Channel([TopK(), DP()])` from Python; Hydra's `channel=[topk,dp]` passes them by name, in that order.
        `AttackPosition()` (`attack` in a list) places the attack; a compressor with `error_feedback` is wrapped."""
        listed = [*(stages or []), *named.values()]
        names = [type(s).__name__.lower() for s in stages or []] + list(named)
        self.chain: list[Stage] = []  # the run order: every stage and the attack
        self.stages: list[Stage] = []  # the listed stages without the attack: stage n draws from stream n
        self.names: list[str] = []
        self.rule_stages: list[Stage] = []  # the aggregator's own (`connect`), after the listed ones in `stages`
        for name, stage in zip(names, listed):
            if isinstance(stage, AttackPosition):
                self.chain.append(stage)
                continue
            if isinstance(stage, Compressor) and stage.error_feedback:
                stage = ErrorFeedback(stage)
            self.chain.append(stage)
            self.stages.append(stage)
            self.names.append(name)
        self.listed = names
        if sum(isinstance(s, AttackPosition) for s in self.chain) > 1:
            raise ValueError(f"channel={self.shown} is not allowed: it places the attack twice, and it acts once")
        if not any(isinstance(s, AttackPosition) for s in self.chain):
            first_private = next((i for i, s in enumerate(self.chain) if s.privatises), len(self.chain))
            self.chain.insert(first_private, AttackPosition())
        private = [name for name, s in zip(names, listed) if s.privatises]
        for i, stage in enumerate(self.chain):
            if not stage.privatises and stage.on != "models" and any(s.privatises for s in self.chain[:i]):
                after = self.names[self.stages.index(stage)]
                runs = [n for n, s in zip(names, listed) if not s.privatises] + private
                raise ValueError(f"channel={self.shown} is not allowed: {after} after {private[0]} would change the "
                                 f"clipped updates {private[0]}'s noise is scaled for; "
                                 f"write channel=[{','.join(runs)}]")

    @property
    def shown(self) -> str:
        """The channel as the command line writes it: none, topk, [topk,dp]."""
        names = self.listed
        return "none" if not names else names[0] if len(names) == 1 else f"[{','.join(names)}]"

    @property
    def attack(self) -> AttackPosition:
        return next(s for s in self.chain if isinstance(s, AttackPosition))

    @classmethod
    def of(cls, value: Channel | list[Stage] | None) -> Channel:
        return value if isinstance(value, Channel) else cls(value)

    def connect(self, attack: Attack, rule_stages: list[Stage] = ()) -> Channel:
        """The run's attack acts at the chain's attack position; `rule_stages`, the stages the aggregator's rule
        consists of (FedCAMS's compression: `Aggregator.channel_stages`), run right after it, numbered after the
        listed stages. Refusals (`check`) look at the listed stages only."""
        self.attack.attack = attack
        new = [s for s in rule_stages if all(s is not t for t in self.stages)]
        at = self.chain.index(self.attack) + 1
        self.chain[at:at] = new
        self.stages += new
        self.rule_stages += new
        self.names += [type(s).__name__.lower() for s in new]
        return self

    def check(self, setup: Setup) -> None:
        """Refuse, before training, listed stages the aggregator cannot take; each stage checks the setup."""
        rule = setup.rule
        listed = [s for s in self.stages if all(s is not t for t in self.rule_stages)]
        if rule.compresses_uploads and any(not s.privatises for s in listed):
            twin = rule.same_uncompressed
            once = f"use {twin} channel={self.shown} to compress once, in the channel, or channel=none" if twin else \
                "use channel=none"
            raise ValueError(f"channel={self.shown} is not allowed with {rule.shown}: it compresses every "
                             f"upload itself, so they would be compressed twice; {once}")
        for s in self.stages:
            s.check(setup)  # first: a stage's own reason (DP's privacy) says more than the one below
        if not rule.forms_mean and (sided := [n for n, s in zip(self.names, self.stages) if s.has_server_side]):
            raise ValueError(f"channel={self.shown} is not allowed with {rule.shown}: {', '.join(sided)} acts on the "
                             "weighted mean update on the server, which this rule never forms; use a rule that "
                             "averages the updates (fedavg, fedavgm, fedadam, fedyogi, fedadagrad, fedams)")

    def bits_up(self, num_params: int) -> int | None:
        """Bits one client uploads: the last compressor's count; None (the aggregator's own) without one."""
        counts = [s.bits_up(num_params) for s in self.stages if s.bits_up(num_params) is not None]
        return counts[-1] if counts else None

    def transmit(self, client_params: Tensor, up: Upload, block_rows: int | None = None) -> Arrived:
        """What the aggregator receives [K, P] from the round's clients (`up.ids`; `up.corrupted` marks attackers)
        and the server sides for its mean. The rows become updates (client_params − up.start) before the first
        stage on updates and models again after the last, and models for the attack; a chain of the attack alone
        leaves the models as they are, bit for bit. Consecutive row-wise stages (`Stage.rowwise`: compressors,
        error feedback) run on `block_rows` rows at a time (the engine's clients in memory; None: all), so their
        temporaries are [block_rows, P], as an aggregator's are; with more than one block their results are
        written over client_params (the round's own tensor, which the aggregator then receives: no second
        [K, P]). Any other stage gets the whole round."""
        active = [s for s in self.chain if not (isinstance(s, AttackPosition) and s.idle(up))]  # idle: rows pass
        gens = {id(s): s.stream(up, next((i for i, t in enumerate(self.stages) if t is s), -1)) for s in active}
        for stage in active:
            stage.begin(up)
        steps = [(s, gens[id(s)]) for s in active if s.has_server_side]
        rows, form, i = client_params, "models", 0
        while i < len(active):
            j = i + 1
            while active[i].rowwise and j < len(active) and active[j].rowwise:
                j += 1
            run, last = active[i:j], j == len(active)
            if run[0].rowwise:
                rows, form = self._in_blocks(run, gens, rows, form, up, block_rows, last)
            else:
                rows, form = _as(run[0].on, rows, form, up.start)
                rows = run[0].client(rows, up, gens[id(run[0])])
            i = j
        if form == "updates":
            rows = up.start + rows
        return Arrived(rows, ServerSide(steps, up))

    @staticmethod
    def _in_blocks(run: list[Stage], gens: dict, rows: Tensor, form: str, up: Upload, block_rows: int | None,
                   last: bool) -> tuple[Tensor, str]:
        """The row-wise stages `run` on `block_rows` rows at a time (each block: its ids, corrupted marks and
        starts), the results written over `rows`; the chain's last run ends each block as models, so no [K, P]
        is added for the final conversion. Returns (rows, their form)."""
        end = "models" if last or run[-1].on == "models" else "updates"
        blocks = row_blocks(rows.shape[0], block_rows)
        for rows_in in blocks:
            start = up.start[rows_in] if up.start.dim() == 2 else up.start
            part = up if len(blocks) == 1 else replace(up, start=start, ids=up.ids[rows_in],
                                                       corrupted=up.corrupted[rows_in],
                                                       held=None if up.held is None else up.held[rows_in])
            x, f = rows[rows_in], form
            for stage in run:
                x, f = _as(stage.on, x, f, start)
                x = stage.client(x, part, gens[id(stage)])
            x, f = _as(end, x, f, start)
            if len(blocks) == 1:
                return x, end  # one block: the rows given stay as they were
            rows[rows_in] = x
        return rows, end

    def metrics(self) -> dict[str, float]:
        return {k: v for s in self.stages for k, v in s.metrics().items()}

    def notes(self) -> list[str]:
        return [note for s in self.stages for note in s.notes()]

    def client_stores(self) -> dict[str, ClientStore]:
        """Each stage's per-client state by a folder name (`channel_<n>_<name>`): the run loop attaches them to
        the run directory."""
        return {f"channel_{n}_{name}": store
                for n, s in enumerate(self.stages) for name, store in s.client_stores().items()}

    def state_dict(self) -> dict:
        return {"stages": [s.state_dict() for s in self.stages]}

    def load_state_dict(self, state: dict | None) -> None:
        if state is None:
            return  # a checkpoint from before the channel: nothing was kept
        stages = state["stages"]
        if "errors" in state:  # before the wrapper, the chain kept each compressor's error memory beside it
            stages = [st if e is None else {"stage": st, "errors": e} for st, e in zip(stages, state["errors"])]
        for s, st in zip(self.stages, stages):
            s.load_state_dict(st)
