"""Bits a round sends between the server and its clients, and their running totals (`metrics.csv`).

Down is what the server sends to every client sampled this round: the global model, its
BatchNorm buffers and what the method adds (SCAFFOLD's c). Up is what the clients that
report send back: their model (as the method sends it: FedCAMS compresses it) and their
buffers. A straggler sends its model after fewer steps, so it counts in full; a client
that drops out (`system=dropout`) was sent the model but sends nothing back. What a method
sends per client it declares in `Aggregator.bits`; buffers are always dense 32-bit. A
channel that compresses (`channel=topk`, ...) replaces the model's part of the up count with
what its last compressor sends; what the method sends beside the model
(SCAFFOLD's Δc) is counted as the method declares it.
"""

from __future__ import annotations

import logging

from fedagg.aggregators.base import Aggregator
from fedagg.aggregators.inputs import dense
from fedagg.channel.chain import Channel

log = logging.getLogger(__name__)


class BitCounter:
    def __init__(self, aggregator: Aggregator, num_params: int, num_buffers: int, channel: Channel | None = None) -> None:
        self.aggregator, self.num_params, self.num_buffers = aggregator, num_params, num_buffers
        self.channel = channel if channel is not None else Channel()
        self.up_total: int | None = 0  # None: unknown (resumed from a checkpoint that did not count)
        self.down_total: int | None = 0

    def count(self, sampled: int, reported: int) -> dict[str, int | None]:
        """The round's metrics columns: bits sent down to `sampled` clients, up from the `reported` ones, totals."""
        per_client = self.aggregator.bits(self.num_params)
        down, up = sampled * (per_client.down + dense(self.num_buffers)), reported * self.up_each()
        if self.up_total is not None:
            self.down_total, self.up_total = self.down_total + down, self.up_total + up
        return {"bits_down": down, "bits_up": up, "bits_down_total": self.down_total, "bits_up_total": self.up_total}

    def up_each(self) -> int:
        """Bits one reporting client sends up: its model as the method or the channel sends it, what the method
        sends beside it, its buffers (the clock's upload time)."""
        per_client = self.aggregator.bits(self.num_params)
        sent = self.channel.bits_up(self.num_params)
        up_each = per_client.up if sent is None else sent + per_client.beside_model  # the channel sends the model
        return up_each + dense(self.num_buffers)

    def state_dict(self) -> dict:
        return {"up_total": self.up_total, "down_total": self.down_total}

    def load_state_dict(self, state: dict | None) -> None:
        if state is None:  # the rounds before the checkpoint were not counted: totals are left empty, not wrong
            log.warning("the checkpoint has no bit counts: bits_up_total and bits_down_total stay empty")
            self.up_total = self.down_total = None
            return
        self.up_total, self.down_total = state["up_total"], state["down_total"]
