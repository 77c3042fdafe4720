"""What a run is made of: the instantiated config groups (`Parts`) and the federation assembled from them
(`Federation`), as plain data. `fedagg.loop.assembly` makes the one from the other; the round loop reads the
second. The server (`fedagg.loop.server`) is held, not named here: it drives loops of this federation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from torch import Tensor, nn

from fedagg.aggregators.base import Aggregator
from fedagg.attacks.base import Attack
from fedagg.channel.chain import Channel
from fedagg.clients.client import ClientData
from fedagg.clients.trainer import LocalSGD
from fedagg.config.settings import Settings
from fedagg.data.device import DeviceData
from fedagg.engines.base import Engine
from fedagg.engines.choice import Picked
from fedagg.models.adapters import Adapters, NoAdapter
from fedagg.sampling.base import Sampler
from fedagg.system.base import System
from fedagg.system.clock import Clock
from fedagg.tracking.base import Tracker


@dataclass
class Parts:
    """The instantiated config groups of one run."""

    dataset: Callable[..., object]  # dataset(root=..., download=...) -> DatasetBundle
    partition: Callable[..., list[Tensor]]  # partition(labels, num_clients, generator=...) -> index tensors
    model: Callable[..., nn.Module]  # model(num_classes=, in_channels=, image_size=)
    aggregator: Aggregator
    client: LocalSGD
    engine: Engine
    logger: Tracker = field(default_factory=Tracker)
    system: System = field(default_factory=System)  # who is online, reports, and how many steps each takes
    clock: Clock = field(default_factory=Clock)  # simulated time (clock=none: none)
    server: object = None  # rounds, or arrivals (fedagg.loop.server); None: synchronous rounds
    attack: Attack = field(default_factory=Attack)  # which clients are corrupted, and how
    channel: Channel | list | None = None  # what clients send (compression, privacy): a Channel or a list of stages
    sampler: Sampler = field(default_factory=Sampler)  # who of those that can take part trains (uniform)
    noise: float = 0.0  # partition.noise: client i of N sees Gaussian noise of sd noise * i / N on its images
    choices: dict = field(default_factory=dict)  # group -> option as the user chose it, for refusals in their words
    adapter: NoAdapter = field(default_factory=NoAdapter)  # adapter=lora: low-rank adapters on a frozen base


@dataclass
class Federation:
    data: DeviceData
    model: nn.Module
    clients: list[ClientData]
    aggregator: Aggregator
    trainer: LocalSGD
    engine: Engine
    tracker: Tracker
    server_idx: Tensor  # training-pool samples the server holds out (never a client's)
    partition: dict = field(default_factory=dict)  # sizes and class counts, for partition.json
    system: System = field(default_factory=System)
    clock: Clock = field(default_factory=Clock)
    server: object = None  # its `drive(loop)` runs the rounds (fedagg.loop.server; `assemble` sets it)
    attack: Attack = field(default_factory=Attack)
    corrupted: list[int] = field(default_factory=list)  # ids of the corrupted clients
    channel: Channel = field(default_factory=Channel)
    sampler: Sampler = field(default_factory=Sampler)
    settings: Settings | None = None  # as run: num_clients=None resolved to the dataset's number of clients
    adapters: Adapters = field(default_factory=Adapters.none)  # the model's adapters and frozen base (adapter=lora)
    picked: Picked | None = None  # the engine engine=auto picked, and why; None: the user picked it
