"""The cross_device workload of scripts/bench.py, laid out once so that every framework trains the same round.

fedagg builds the federation as a run would (partition, model initialisation, client sampling, each client's
batch order); each framework is then handed, per round, the same clients with the same samples in the same order,
so the frameworks differ only in how they execute a round. The plain loop and Flower's client share `local_sgd`.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # bench.py: the workload's definition (it puts the repository on the path)
    sys.path.insert(0, str(SCRIPTS))

import bench  # noqa: E402
from fedagg.aggregators.base import FedAvg  # noqa: E402
from fedagg.aggregators.inputs import RoundInputs  # noqa: E402
from fedagg.clients.trainer import LocalSGD  # noqa: E402
from fedagg.config.settings import Settings  # noqa: E402
from fedagg.data.partition import iid  # noqa: E402
from fedagg.engines.base import RoundJob  # noqa: E402
from fedagg.loop.assembly import Parts, assemble  # noqa: E402
from fedagg.models.flat import ParamLayout, get_buffers, get_params  # noqa: E402
from fedagg.sampling.pool import sample_clients  # noqa: E402
from fedagg.engines.sequential import SequentialEngine  # noqa: E402

LR = LocalSGD().lr  # fedagg's default client learning rate (conf/client/sgd.yaml says the same)
SEED = 0


@dataclass
class Workload:
    num_clients: int = 1000
    per_round: int = 100
    samples_per_client: int = 60
    batch_size: int = 10
    local_epochs: int = 1
    model: str = "cnn_small"


class Shared:
    """The federation every framework trains: fedagg's clients, model and data, and each round's batches."""

    def __init__(self, bundle, w: Workload, rounds: int) -> None:
        self.w = w
        self.settings = Settings(seed=SEED, rounds=rounds, num_clients=w.num_clients, clients_per_round=w.per_round)
        self.trainer = LocalSGD(lr=LR, local_epochs=w.local_epochs, batch_size=w.batch_size)
        fed = assemble(Parts(dataset=lambda root, download: bundle,
                             partition=partial(iid, samples_per_client=w.samples_per_client),
                             model=bench.MODELS[w.model], aggregator=FedAvg(), client=self.trainer,
                             engine=SequentialEngine()),
                       self.settings, data_root=Path("."), device=torch.device("cpu"))
        self.model, self.data, self.clients = fed.model, fed.data, fed.clients
        if get_buffers(self.model).numel():  # FedAvg of buffers would need its own rule in every row
            raise ValueError(f"model {w.model} has buffers; the peer benchmark averages parameters only")
        self.layout = ParamLayout.of(self.model)
        self.initial = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        # every training sample as the model takes it, prepared once (sample by sample, as fedagg prepares a batch)
        self.x = self.data.prepare(self.data.train_images(torch.arange(self.data.train_x.shape[0])))
        self.y = self.data.train_y
        self.all_num_samples = torch.tensor([c.num_samples for c in self.clients])

    def chosen(self, r: int) -> list:
        """The clients fedagg's uniform sampler picks for round r (ascending ids)."""
        return [self.clients[i] for i in sample_clients(self.settings, r)]

    def order(self, client, r: int) -> Tensor:
        """Client's training samples of round r in the order it trains on them: fedagg's batch plan."""
        return self.trainer.plan([client], self.data, seed=SEED, round=r).order

    def flat(self, state: dict[str, Tensor]) -> Tensor:
        """A state dict as fedagg's flat parameter vector [P]."""
        return torch.cat([state[name].reshape(-1) for name in self.layout.names])

    def new_model(self) -> nn.Module:
        return copy.deepcopy(self.model)


def batches(order: Tensor, batch_size: int, epochs: int) -> list[Tensor]:
    """Each epoch's permutation cut into batches (a partial batch last), as fedagg serves them."""
    return [b for epoch in order.view(epochs, -1) for b in epoch.split(batch_size)]


def local_sgd(model: nn.Module, x: Tensor, y: Tensor, steps: list[Tensor], lr: float) -> None:
    """One client's local training, the plain PyTorch way: torch.optim.SGD over its batches."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    for idx in steps:
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


class PlainLoop:
    """For each sampled client: load the global state, SGD over its batches, add its weighted state to the mean."""

    name = "plain PyTorch"

    def __init__(self, shared: Shared) -> None:
        self.s, self.model = shared, shared.new_model()
        self.state = {k: v.clone() for k, v in shared.initial.items()}

    def round(self, r: int) -> None:
        s, chosen = self.s, self.s.chosen(r)
        total = sum(c.num_samples for c in chosen)
        mean = {k: torch.zeros_like(v) for k, v in self.state.items()}
        for c in chosen:
            self.model.load_state_dict(self.state)
            local_sgd(self.model, s.x, s.y, batches(s.order(c, r), s.w.batch_size, s.w.local_epochs), LR)
            with torch.no_grad():
                for k, v in self.model.state_dict().items():
                    mean[k].add_(v, alpha=c.num_samples / total)
        self.state = mean

    def params(self) -> Tensor:
        return self.s.flat(self.state)


class FedaggEngine:
    """A round as fedagg runs it: the engine trains the sampled clients, fedagg's FedAvg aggregates them."""

    def __init__(self, shared: Shared, name: str, engine) -> None:
        self.s, self.name, self.engine = shared, name, engine
        self.trainer = LocalSGD(lr=LR, local_epochs=shared.w.local_epochs, batch_size=shared.w.batch_size)
        self.global_params = shared.flat(shared.initial)
        self.global_buffers = get_buffers(shared.model)
        self.aggregator = FedAvg()

    def round(self, r: int) -> None:
        s, chosen = self.s, self.s.chosen(r)
        out = self.engine.train_round(RoundJob(s.model, self.trainer, s.data, chosen, self.global_params,
                                               self.global_buffers, lr=LR, seed=SEED, round=r))
        inputs = RoundInputs(self.global_params, out.params, torch.tensor([c.num_samples for c in chosen]),
                             torch.tensor([c.id for c in chosen]), r, s.layout, s.all_num_samples, seed=SEED)
        self.global_params = self.aggregator.aggregate(inputs).params

    def params(self) -> Tensor:
        return self.global_params

