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

With low-rank adapters (`adapter=lora`) a client holds only its own rank's factors, not the flat vector
padded to the largest rank: what it is sent and sends back is what the rule says for that client
(`Aggregator.adapter_values`: FLoRA's stacked factors down, FedSA-LoRA's A alone), and a compressing channel
compresses, and is counted on, those values alone.
"""

from __future__ import annotations

import logging

from collections.abc import Sequence

from fedagg.aggregators.base import Aggregator
from fedagg.aggregators.inputs import dense
from fedagg.channel.chain import Channel
from fedagg.models.adapters.layout import AdapterLayout

log = logging.getLogger(__name__)


class BitCounter:
    def __init__(self, aggregator: Aggregator, num_params: int, num_buffers: int, channel: Channel | None = None,
                 adapters: AdapterLayout | None = None) -> None:
        self.aggregator, self.num_params, self.num_buffers = aggregator, num_params, num_buffers
        self.channel = channel if channel is not None else Channel()
        self.adapters = adapters  # the model's low-rank adapters (None: every client holds all P values)
        self.up_total: int | None = 0  # None: unknown (resumed from a checkpoint that did not count)
        self.down_total: int | None = 0

    def count(self, sampled: Sequence[int], reported: Sequence[int]) -> dict[str, int | None]:
        """The round's metrics columns: bits sent down to the `sampled` clients (ids), up from the `reported` ones,
        totals."""
        down = sum(self.aggregator.bits(self.values(i, reported)[0]).down + dense(self.num_buffers) for i in sampled)
        up = sum(self.up_each(i) for i in reported)
        if self.up_total is not None:
            self.down_total, self.up_total = self.down_total + down, self.up_total + up
        return {"bits_down": down, "bits_up": up, "bits_down_total": self.down_total, "bits_up_total": self.up_total}

    def values(self, client: int, reported: Sequence[int]) -> tuple[int, int]:
        """(values of the model client `client` receives, values it sends): all P, or with adapters what the rule
        sends a client of its rank (`reported`: the round's reporting clients, whose factors FLoRA stacks)."""
        if self.adapters is None:
            return self.num_params, self.num_params
        return self.aggregator.adapter_values(self.adapters, client, reported)

    def up_each(self, client: int) -> int:
        """Bits client `client` sends up when it reports: its model as the method or the channel sends it, what the
        method sends beside it, its buffers (the clock's upload time)."""
        n = self.values(client, ())[1]
        per_client = self.aggregator.bits(n)
        sent = self.channel.bits_up(n)
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
