"""Error feedback as a wrapper of any compressor (Karimireddy et al. 2019).

`ErrorFeedback(TopK(...))`: client k sends C(u) with u = e_k + Δ_k and keeps e_k ← u − C(u) by
its id (`ErrorMemory`, a `ClientStore` the run attaches to its folder). e_k starts at zero. The
wrapped stage's server side, bits, checks and metrics are its own; the chain wraps a compressor
whose options say `error_feedback: true`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedagg.channel.base import Setup, Stage, Upload
from fedagg.channel.errors import ErrorMemory
from fedagg.clients.store import ClientStore


class ErrorFeedback(Stage):
    def __init__(self, inner: Stage, measure: bool = False) -> None:
        """`measure`: keep `held_back`, the mean ‖e_k‖ of the round's clients after it (FedCAMS reports it)."""
        self.inner, self.measure = inner, measure
        self.memory = ErrorMemory()
        self.privatises, self.needs_uniform_mean = inner.privatises, inner.needs_uniform_mean
        self.rowwise = inner.rowwise  # e_k is each row's own: row blocks whenever the compressor allows them
        self.held_back: float | None = None
        self.norms: list[Tensor] = []  # this round's ‖e_k‖, block by block

    def begin(self, up: Upload) -> None:
        self.inner.begin(up)
        self.held_back, self.norms = None, []

    def client(self, rows: Tensor, up: Upload, g: torch.Generator) -> Tensor:
        u = rows + torch.stack([self.memory.get(i, rows[0]) for i in up.ids])  # u = e_k + Δ_k
        sent = self.inner.client(u, up, g)
        residual = u - sent
        for i, e in zip(up.ids, residual):
            self.memory.put(i, e)  # e_k ← u − C(u)
        if self.measure:  # the round's rows may come in blocks: the mean over all of them so far
            self.norms.append(torch.linalg.vector_norm(residual, dim=1))
            self.held_back = float(torch.cat(self.norms).mean())
        return sent

    def server(self, mean: Tensor, up: Upload, g: torch.Generator) -> Tensor:
        return self.inner.server(mean, up, g)

    def stream(self, up: Upload, n: int) -> torch.Generator:
        return self.inner.stream(up, n)

    @property
    def has_server_side(self) -> bool:
        return self.inner.has_server_side

    def bits_up(self, num_params: int) -> int | None:
        return self.inner.bits_up(num_params)

    def check(self, setup: Setup) -> None:
        self.inner.check(setup)

    def metrics(self) -> dict[str, float]:
        return self.inner.metrics()

    def notes(self) -> list[str]:
        return self.inner.notes()

    def client_stores(self) -> dict[str, ClientStore]:
        return {**self.inner.client_stores(), "errors": self.memory.rows}

    def state_dict(self) -> dict:
        return {"stage": self.inner.state_dict(), "errors": self.memory.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state["stage"])
        self.memory.load_state_dict(state["errors"])
