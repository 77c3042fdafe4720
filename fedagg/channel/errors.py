"""Per-client error feedback memory, kept by client id on the host.

Narrow on purpose (get, put, state): where the rows live (memory now, a file per client
later) can change without touching the compressors.
"""

from __future__ import annotations

import torch
from torch import Tensor


class ErrorMemory:
    def __init__(self) -> None:
        self.rows: dict[int, Tensor] = {}

    def get(self, client_id: int, like: Tensor) -> Tensor:
        """e_k on `like`'s device and dtype; zeros for a client never seen (Karimireddy et al. 2019: e_0 = 0)."""
        e = self.rows.get(client_id)
        return torch.zeros_like(like) if e is None else e.to(like)

    def put(self, client_id: int, error: Tensor) -> None:
        self.rows[client_id] = error.to("cpu", copy=True)  # its own storage: a row view would keep the round alive

    def __len__(self) -> int:
        return len(self.rows)

    def state_dict(self) -> dict:
        return {i: e.clone() for i, e in self.rows.items()}

    def load_state_dict(self, state: dict) -> None:
        self.rows = {int(i): e.clone() for i, e in state.items()}
