"""The protocol's arithmetic, free of Hydra and of any launcher: its settings and their checks, the seeds, a
trial's score, the selection, and the rows of selection.csv."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

VALIDATION = ("split", "clients")  # split: every client's own client.val_frac split; clients: held-out clients


@dataclass(frozen=True)
class Protocol:
    methods: tuple[str, ...]
    budget: int  # trials per method, exactly
    tune_seeds: tuple[int, ...]  # every trial runs on each; the same for every method
    confirm_seeds: tuple[int, ...]  # fresh seeds for the confirm runs, disjoint from tune_seeds
    baseline: str  # the method the paired statistics compare against
    val_frac: float  # client.val_frac of tuning and confirm runs when the run config leaves it null
    batch: int = 1  # trials of each method launched together (joblib / Slurm run them at once)
    sampler_seed: int = 0
    validation: str = "split"  # split | clients (eval.held_out_clients=held_out in every run)
    held_out: float = 0.2

    def run_values(self, val_frac_set: bool) -> dict[str, float]:
        """The settings that give every tuning and confirm run the same validation data."""
        if self.validation == "clients":
            return {"eval.held_out_clients": self.held_out}
        return {} if val_frac_set else {"client.val_frac": self.val_frac}

    def run_keys(self, val_frac_set: bool) -> list[str]:
        return [f"{k}={v}" for k, v in self.run_values(val_frac_set).items()]

    def check_runs(self, num_clients: int | None, clients_per_round: int | None, val_frac) -> None:
        """Refuse, in the comparison's own keys, run settings its trials could not be scored with: held-out clients
        that leave too few to train, a validation split that holds nothing out (`val_frac`: the run's
        client.val_frac, None when the protocol sets it). `num_clients` None: known once the data is loaded."""
        if self.validation == "clients" and isinstance(num_clients, int) and num_clients >= 1:
            held = math.ceil(self.held_out * num_clients)
            if held >= num_clients:
                raise ValueError(f"held_out={self.held_out:g} is not allowed with num_clients={num_clients}: it holds "
                                 f"out all {num_clients} clients and leaves none to train; give a smaller share, "
                                 "e.g. held_out=0.2")
            if isinstance(clients_per_round, int) and clients_per_round > num_clients - held:
                raise ValueError(f"held_out={self.held_out:g} is not allowed with clients_per_round={clients_per_round}: "
                                 f"it leaves {num_clients - held} of the {num_clients} clients to train, fewer than a "
                                 "round takes; give a smaller held_out or clients_per_round")
        if self.validation == "split" and val_frac is not None and val_frac == 0:
            raise ValueError(f"client.val_frac={val_frac} is not allowed here: trials are scored on each client's "
                             "validation split, and it holds none out; leave client.val_frac out (the comparison then "
                             f"holds out val_frac={self.val_frac:g}), or score on held-out clients with validation=clients")

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def make_protocol(methods, budget, tune_seeds, confirm_seeds, baseline, val_frac, batch, sampler_seed,
                  validation="split", held_out=0.2) -> Protocol:
    """The settings of a protocol, or a ValueError whose one line names the key, the value and what is allowed.
    `confirm_seeds`: a count (that many seeds after the largest tuning seed) or a list of seeds."""
    if isinstance(methods, str):
        methods = [methods]
    methods = list(methods or [])
    if not methods or not all(isinstance(m, str) and m for m in methods):
        raise ValueError(f"methods={methods!r} is not allowed; give a list of method names, e.g. methods=[fedavg,fedprox]")
    if len(set(methods)) < len(methods):
        raise ValueError(f"methods={methods!r} is not allowed; each method once")
    if not _is_int(budget) or budget < 1:
        raise ValueError(f"budget={budget!r} is not allowed; it must be an integer >= 1 (trials per method)")
    tune = list(tune_seeds) if not _is_int(tune_seeds) else [tune_seeds]
    if not tune or not all(_is_int(s) and s >= 0 for s in tune) or len(set(tune)) < len(tune):
        raise ValueError(f"tune_seeds={tune_seeds!r} is not allowed; give distinct integers >= 0, e.g. tune_seeds=[0]")
    if _is_int(confirm_seeds):
        if confirm_seeds < 1:
            raise ValueError(f"confirm_seeds={confirm_seeds!r} is not allowed; give a count >= 1 or a list of seeds")
        confirm = list(range(max(tune) + 1, max(tune) + 1 + confirm_seeds))
    else:
        confirm = list(confirm_seeds or [])
        if not confirm or not all(_is_int(s) and s >= 0 for s in confirm) or len(set(confirm)) < len(confirm):
            raise ValueError(f"confirm_seeds={confirm_seeds!r} is not allowed; give a count >= 1 or distinct integers >= 0")
        if shared := sorted(set(confirm) & set(tune)):
            raise ValueError(f"confirm_seeds={confirm!r} is not allowed; seed {shared[0]} is also a tuning seed "
                             f"(tune_seeds={tune}): confirmation needs fresh seeds")
    if baseline is None:
        baseline = methods[0]
    if baseline not in methods:
        raise ValueError(f"baseline={baseline!r} is not allowed; choose one of the methods: {', '.join(methods)}")
    if isinstance(val_frac, bool) or not isinstance(val_frac, (int, float)) or not 0 < val_frac < 1:
        raise ValueError(f"val_frac={val_frac!r} is not allowed; it must be a fraction in (0, 1)")
    if not _is_int(batch) or batch < 1:
        raise ValueError(f"batch={batch!r} is not allowed; it must be an integer >= 1 (trials per method launched together)")
    if not _is_int(sampler_seed):
        raise ValueError(f"sampler_seed={sampler_seed!r} is not allowed; it must be an integer")
    if validation not in VALIDATION:
        raise ValueError(f"validation={validation!r} is not allowed; choose split (each client's client.val_frac) or "
                         "clients (a seeded share, held_out, of the clients never trained on)")
    if isinstance(held_out, bool) or not isinstance(held_out, (int, float)) or not 0 < held_out < 1:
        raise ValueError(f"held_out={held_out!r} is not allowed; it must be a fraction in (0, 1) of the clients")
    return Protocol(tuple(methods), budget, tuple(tune), tuple(confirm), baseline, float(val_frac), batch, sampler_seed,
                    validation, float(held_out))


def last_rounds(rounds: int) -> int:
    """How many of the last evaluated rounds a score averages: ceil(R/10) (Kuo et al. 2023)."""
    return max(1, math.ceil(rounds / 10))


def score(rows: list[dict], rounds: int, status: str) -> float:
    """A trial run's score: mean validation accuracy over its last ceil(R/10) evaluated rounds. A run that
    diverged scores 0, below any run that learned something, so it is never chosen over one that did not."""
    if status == "diverged":
        return 0.0
    values = [float(r["val_acc"]) for r in rows if r.get("val_acc") not in (None, "")]
    if not values:
        raise ValueError("the run has no val_acc (was it run with eval.split=val?)")
    tail = values[-last_rounds(rounds):]
    return sum(tail) / len(tail)


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def select(trials: list[dict]) -> dict:
    """The best trial by val_score; a tie goes to the earlier trial (the choice does not depend on run order)."""
    return max(trials, key=lambda t: (t["val_score"], -t["trial"]))


SELECTION_COLUMNS = ("method", "trial", "params", "val_score", "chosen")


def selection_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(SELECTION_COLUMNS)
    for r in rows:
        writer.writerow([r["method"], r["trial"], json.dumps(r["params"], sort_keys=True), repr(float(r["val_score"])),
                         str(bool(r["chosen"])).lower()])
    return out.getvalue()


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
