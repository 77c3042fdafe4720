"""Per-client error feedback memory, kept by client id on the host.

Narrow on purpose (get, put, state): the rows live in a `ClientStore`, bounded in host
memory and referenced (not copied whole) by each checkpoint, like SCAFFOLD's variates; the
run loop attaches it to a folder of the run (`Channel.client_stores`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedagg.clients.store import ClientStore


class ErrorMemory:
    def __init__(self) -> None:
        self.rows = ClientStore()

    def get(self, client_id: int, like: Tensor) -> Tensor:
        """e_k on `like`'s device and dtype; zeros for a client never seen (Karimireddy et al. 2019: e_0 = 0)."""
        e = self.rows.get(client_id)
        return torch.zeros_like(like) if e is None else e.to(like)

    def put(self, client_id: int, error: Tensor) -> None:
        self.rows.put(client_id, error)  # the store keeps its own CPU copy: a row view would keep the round alive

    def __len__(self) -> int:
        return len(self.rows)

    def state_dict(self) -> dict:
        return self.rows.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.rows.load_state_dict(state)  # a checkpoint from before the store ({id: tensor}) loads as well
