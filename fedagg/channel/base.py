"""The channel's parts: a stage (`Stage`, with a client side and maybe a server side), the round's context
(`Upload`), what the stages check before training (`Setup`, `Rule`), and the attack's position in a chain.
The chain that runs them in list order is `fedagg.channel.chain.Channel`; error feedback wraps a compressor
(`fedagg.channel.feedback.ErrorFeedback`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from fedagg.seeding import generator

if TYPE_CHECKING:
    from fedagg.attacks.base import Attack
    from fedagg.clients.store import ClientStore


@dataclass(frozen=True)
class Rule:
    """The aggregator as the stages check it, built by the run's assembly (`fedagg.loop.assembly.describe`)."""

    shown: str = "aggregator FedAvg"  # as the user typed it ("aggregator=fedcams"), else its class
    weighting: str = "samples"  # samples | uniform
    # a server step on sum_k p_k Δ_k with p fixed before any update is seen: noise on that mean is all it reveals
    weighted_mean: bool = False
    compresses_uploads: bool = False  # the rule's own stages compress every upload (FedCAMS)
    same_uncompressed: str = ""  # the option that is the rule without its own compression, as the user types it
    forms_mean: bool = True  # its step applies sum_k p_k Δ_k (the base Aggregator.aggregate): a server side acts there


@dataclass(frozen=True)
class Setup:
    """What the stages check before training: who can take part, and the aggregator as the user chose it."""

    num_clients: int  # N, every client
    per_round: int  # K, the clients sampled a round
    sampleable: int | None = None  # the clients that can be sampled (N less eval.held_out_clients); None: N
    online_varies: bool = False  # a system takes clients offline: a round samples K of those online then
    rule: Rule = Rule()
    sampler: str = ""  # a sampler whose draw is not uniform, as the user chose it ("sampler=size"); "": uniform

    @property
    def pool(self) -> int:
        return self.num_clients if self.sampleable is None else self.sampleable


@dataclass(frozen=True)
class Upload:
    """One round's upload, as every stage sees it."""

    start: Tensor  # [P] the model the clients started from ([K, P]: one per client)
    ids: tuple[int, ...]  # the reporting clients' global ids, in row order
    corrupted: Tensor  # [K] bool: the rows the attack replaces
    seed: int
    round: int  # 1-based
    pool: int  # N: the clients that can be sampled
    rate: float | None = None  # the chance a client that could be sampled this round was; None: K / pool
    # [K, P] bool: the entries each client holds (adapters of unequal ranks: its own rank's factors, the rest of
    # its padded row zero); None: every client holds all P
    held: Tensor | None = None

    @property
    def num_clients(self) -> int:
        return len(self.ids)


class Stage:
    """One stage of the chain. `client(rows [K, P], up, g)` is its client side, on each client's row (the updates,
    or the models for a stage `on = "models"`); `server(mean [P], up, g)` its server side, on the aggregated mean
    update (none unless overridden). `g` is the stage's own stream this round, `generator(seed, "channel", n,
    round)` with n its place among the listed stages, the same object for both sides. Per-client state goes in
    `client_stores()` (kept by client id, attached to the run folder) and `state_dict()`."""

    on: ClassVar[str] = "updates"  # what `client` receives and returns: "updates" (Δ_k) or "models"
    privatises: ClassVar[bool] = False  # True: clipping and noise; only privatising stages may follow it
    # True: its noise is scaled for the uniform mean of the updates (the edge picks aggregator.weighting=uniform
    # when the user did not choose a weighting)
    needs_uniform_mean: ClassVar[bool] = False
    # True: each row's result depends on that row alone (and its draws come row after row), so the chain runs it
    # on the engine's chunk of rows at a time and its temporaries stay [chunk, P]; False: the whole round at once
    rowwise: ClassVar[bool] = False

    def begin(self, up: Upload) -> None:
        """Called once a round before the client side (which may then come in row blocks): reset what is per round."""

    def client(self, rows: Tensor, up: Upload, g: torch.Generator) -> Tensor:
        return rows

    def server(self, mean: Tensor, up: Upload, g: torch.Generator) -> Tensor:
        return mean

    @property
    def has_server_side(self) -> bool:
        return type(self).server is not Stage.server

    def stream(self, up: Upload, n: int) -> torch.Generator:
        return generator(up.seed, "channel", n, up.round)

    def bits_up(self, num_params: int) -> int | None:
        """What one client uploads after this stage; None: as much as it received."""
        return None

    def check(self, setup: Setup) -> None:
        """Refuse, before training, an aggregator or a setup this stage is not defined with."""

    def metrics(self) -> dict[str, float]:
        """Per-round values for metrics.csv (and, the latest, summary.json): epsilon, the clipping bound."""
        return {}

    def notes(self) -> list[str]:
        """Lines for the start of the run, once `check` has accepted the setup (what the stage assumes, costs)."""
        return []

    def client_stores(self) -> dict[str, ClientStore]:
        """Per-client state by a name (`ClientStore`, kept by client id): the run attaches each to its folder."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class Compressor(Stage):
    """A compressor C(u) on each client's row u, `compress(u [K, P], g) -> [K, P]`. `error_feedback`: the chain
    wraps it in `ErrorFeedback` (the YAML option of `channel=topk` and the others)."""

    error_feedback: bool = False
    rowwise = True  # C(u) of one row; a compressor that draws for the whole [K, P] at once says False

    def compress(self, u: Tensor, g: torch.Generator) -> Tensor:
        raise NotImplementedError

    def client(self, rows: Tensor, up: Upload, g: torch.Generator) -> Tensor:
        """C of each row; where clients hold fewer entries than P (`up.held`), C of those entries alone, as the
        client would compress what it has (top-k's k and sign's scale are of its own values): consecutive rows
        holding the same entries go together, in row order, so the draws still come row after row."""
        if up.held is None:
            return self.compress(rows, g)
        out, k = rows.clone(), 0
        while k < rows.shape[0]:
            j = k + 1
            while j < rows.shape[0] and torch.equal(up.held[j], up.held[k]):
                j += 1
            mine = up.held[k]
            out[k:j, mine] = self.compress(rows[k:j][:, mine], g)  # the rest: zero, as it came
            k = j
        return out


class AttackPosition(Stage):
    """`channel=[attack,...]`: where the corrupted clients' model attack (the `attack` group) replaces what those
    clients send, on the models. Not listed: after the compressors, before the first privatising stage."""

    on = "models"

    def __init__(self) -> None:
        self.attack: Attack | None = None  # the run's attack, set by `Channel.connect`; None: nobody is corrupted

    def idle(self, up: Upload) -> bool:
        """Nothing to replace this round: the rows pass as they are (the chain skips it)."""
        return self.attack is None or not bool(up.corrupted.any())

    def client(self, rows: Tensor, up: Upload, g: torch.Generator) -> Tensor:
        if self.attack is None or not bool(up.corrupted.any()):
            return rows
        return self.attack.corrupt(up.start, rows, up.corrupted, g)

    def stream(self, up: Upload, n: int) -> torch.Generator:
        return generator(up.seed, "attack", up.round)
