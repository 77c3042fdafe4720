"""The top-level settings that drive the round loop, the device, and who takes part in a round."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedagg.config.constraints import typed
from fedagg.seeding import generator



@dataclass(frozen=True)
class Settings:
    """The top-level keys of `conf/config.yaml` that drive the round loop."""

    seed: int = 0
    rounds: int = 20
    num_clients: int | None = 10  # None: all of the dataset's own clients, resolved when the data is loaded
    clients_per_round: int | None = None
    eval_every: int = 1
    target_acc: float | None = None
    stop_at_target: bool = False
    checkpoint_every: int = 10
    eval_per_client: bool = False  # eval.per_client: score the global model on every client's local test split
    eval_split: str = "test"  # eval.split: test | val (the clients' validation splits pooled; the test set is never read)
    held_out: float = 0.0  # eval.held_out_clients: a seeded share of the clients never sampled; eval.split=val scores on them

    def __post_init__(self) -> None:
        def need(ok: bool, key: str, value, allowed: str) -> None:
            if not ok:
                raise ValueError(f"{key}={typed(value)} is not allowed; {allowed}")

        need(self.eval_split in ("test", "val"), "eval.split", self.eval_split,
             "choose one of test, val (val: the clients' pooled client.val_frac splits, for tuning)")
        need(isinstance(self.held_out, (int, float)) and not isinstance(self.held_out, bool) and 0 <= self.held_out < 1,
             "eval.held_out_clients", self.held_out, "it must be a fraction in [0, 1) of the clients")
        need(isinstance(self.seed, int), "seed", self.seed, "it must be an integer")
        need(isinstance(self.rounds, int) and self.rounds >= 1, "rounds", self.rounds, "it must be an integer >= 1")
        need(self.num_clients is None or isinstance(self.num_clients, int) and self.num_clients >= 1, "num_clients",
             self.num_clients, "it must be an integer >= 1, or null for all of a federated dataset's own clients")
        if self.clients_per_round is not None and self.num_clients is not None:
            need(
                isinstance(self.clients_per_round, int) and 1 <= self.clients_per_round <= self.num_clients,
                "clients_per_round",
                self.clients_per_round,
                f"it must be an integer from 1 to num_clients={self.num_clients}, or null for all",
            )
        if isinstance(self.num_clients, int) and self.num_clients >= 1 and len(self.held_out_ids) >= self.num_clients:
            need(False, "eval.held_out_clients", self.held_out,
                 f"it holds out all {self.num_clients} clients; give a smaller share")
        if self.clients_per_round is not None and self.held_out_ids:
            trainable = self.num_clients - len(self.held_out_ids)
            need(self.clients_per_round <= trainable, "clients_per_round", self.clients_per_round,
                 f"it must be at most the {trainable} clients eval.held_out_clients={self.held_out} leaves to train")
        need(isinstance(self.eval_every, int) and self.eval_every >= 1, "eval_every", self.eval_every, "it must be an integer >= 1")
        need(isinstance(self.checkpoint_every, int) and self.checkpoint_every >= 0, "checkpoint_every",
             self.checkpoint_every, "it must be an integer >= 0 (0: only at the end)")
        if self.target_acc is not None:
            need(0 < self.target_acc <= 1, "target_acc", self.target_acc, "it must be a fraction in (0, 1], or null")
        need(isinstance(self.eval_per_client, bool), "eval.per_client", self.eval_per_client, "it must be true or false")
        need(isinstance(self.stop_at_target, bool), "stop_at_target", self.stop_at_target, "it must be true or false")
        need(not self.stop_at_target or self.target_acc is not None, "stop_at_target", self.stop_at_target,
             "it needs a target_acc to stop at (set target_acc=0.95, say, or stop_at_target=false)")

    @property
    def per_round(self) -> int:
        return self.clients_per_round or self.num_clients - len(self.held_out_ids)

    @property
    def held_out_ids(self) -> list[int]:
        """The clients eval.held_out_clients keeps out of training: ceil(share * N), drawn from their own stream
        (the same for every method with this seed)."""
        if not self.held_out:
            return []
        count = math.ceil(self.held_out * self.num_clients)
        return sorted(torch.randperm(self.num_clients, generator=generator(self.seed, "held_out_clients"))[:count].tolist())
