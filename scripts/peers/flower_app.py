"""The workload in Flower's simulation (Message API, Ray backend): a ServerApp running Flower's FedAvg, a ClientApp
whose train is the plain loop's client code, one CPU per client actor.

Flower samples its 100 nodes of 1,000 as it always does (fraction_train=0.1); each sampled node is then told
which of fedagg's sampled clients it plays, so Flower trains the same clients on the same batches as the other
rows. A node's data is the round's prepared training set, written once to a file every actor maps (torch.load
with mmap), as a simulation would give each actor its dataset partition.
"""

from __future__ import annotations

import os
import time
from functools import cache

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation

from peers.workload import LR, batches, local_sgd

client_app = ClientApp()


@cache
def _work(path: str) -> dict:
    """The training set and every round's batch orders, loaded once per actor process."""
    return torch.load(path, mmap=True, weights_only=False)


@cache
def _model(path: str) -> torch.nn.Module:
    return _work(path)["model"]


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    work = _work(config["data"])
    torch.set_num_threads(1)  # one CPU per client actor
    model = _model(config["data"])
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    order = work["orders"][f"{config['server-round']}:{config['client']}"]
    local_sgd(model, work["x"], work["y"], batches(order, work["batch_size"], work["epochs"]), LR)
    # the actor's CPU seconds so far: what each round cost the actors, whatever else ran on the machine
    metrics = MetricRecord({"num-examples": order.numel() // work["epochs"], "cpu-s": time.process_time(),
                            "pid": os.getpid()})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)


class SameClients(FedAvg):
    """FedAvg whose sampled nodes train fedagg's sampled clients (`ids[round]`); it stamps each round's start
    (before sampling) and end (after aggregation), the CPU seconds of the driver and of the actors, and keeps
    round 1's global model."""

    def __init__(self, ids: dict[int, list[int]], data: str, **kw) -> None:
        super().__init__(**kw)
        self.ids, self.data = ids, data
        self.started: dict[int, float] = {}
        self.ended: dict[int, float] = {}
        self.driver_cpu: dict[int, float] = {}  # CPU seconds of this process in each round
        self.actor_cpu: dict[int, float] = {}  # ... and of the client actors
        self.actors: dict[int, float] = {}  # each actor's CPU seconds at its latest reply
        self.first: dict[str, torch.Tensor] | None = None

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        self.started[server_round] = time.perf_counter()
        self.driver_cpu[server_round] = -time.process_time()
        sampled = list(super().configure_train(server_round, arrays, config, grid))
        out = []
        for msg, cid in zip(sampled, self.ids[server_round], strict=True):
            own = ConfigRecord({**msg.content["config"], "client": cid, "data": self.data})
            out.append(Message(RecordDict({"arrays": arrays, "config": own}), message_type=MessageType.TRAIN,
                               dst_node_id=msg.metadata.dst_node_id))
        return out

    def aggregate_train(self, server_round: int, replies):
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)
        self.ended[server_round] = time.perf_counter()
        self.driver_cpu[server_round] += time.process_time()
        latest = {}
        for msg in replies:
            m = msg.content["metrics"]
            latest[m["pid"]] = max(latest.get(m["pid"], 0.0), m["cpu-s"])
        # an actor's CPU between its latest replies of two rounds (its first: since it started)
        self.actor_cpu[server_round] = sum(cpu - self.actors.get(pid, 0.0) for pid, cpu in latest.items())
        self.actors.update(latest)
        if server_round == 1:
            self.first = arrays.to_torch_state_dict()
        return arrays, metrics


def simulate(initial: dict[str, torch.Tensor], ids: dict[int, list[int]], data: str, num_clients: int,
             cpus: int) -> tuple[SameClients, float, float]:
    """Run len(ids) rounds; (the strategy with its stamps, perf_counter when the simulation was started and when
    it returned)."""
    per_round = len(ids[1])
    strategy = SameClients(ids, data, fraction_train=per_round / num_clients, fraction_evaluate=0.0,
                           min_train_nodes=per_round, min_available_nodes=num_clients)
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy.start(grid, ArrayRecord(initial), num_rounds=len(ids))

    t0 = time.perf_counter()
    run_simulation(server_app, client_app, num_supernodes=num_clients,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": cpus}})
    return strategy, t0, time.perf_counter()
