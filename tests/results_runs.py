"""Hand-made run folders for the fedagg.results tests: the files a run writes, written directly."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def fake_run(folder: Path, *, status="completed", seed=0, acc=0.5, best=None, choices=None, config=None,
             overrides=None, metrics=None, weights=None, clients=None, **fields) -> Path:
    """A finished run: summary.json (and the CSVs given)."""
    folder.mkdir(parents=True)
    choices = {"dataset": "digits", "aggregator": "fedavg", **(choices or {})}
    summary = {"status": status, "seed": seed, "final_test_acc": acc, "best_test_acc": best if best is not None else acc,
               "rounds_completed": 3, "rounds_to_target": None, "choices": choices,
               "overrides": overrides if overrides is not None else [f"aggregator={choices['aggregator']}", f"seed={seed}"],
               "config": {"seed": seed, "rounds": 3, **(config or {})}, **fields}
    (folder / "summary.json").write_text(json.dumps(summary))
    if metrics is None and status == "completed" and acc is not None:  # a run always writes one: its last row is final
        metrics = [{"round": r, "test_acc": acc} for r in range(1, int(summary["rounds_completed"]) + 1)]
    for name, rows in (("metrics.csv", metrics), ("weights.csv", weights), ("clients.csv", clients)):
        if rows:
            write_csv(folder / name, rows)
    return folder


def dead_pid() -> int:
    """The id of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def unfinished_run(folder: Path, *, pid: int, checkpoint: bool, seed=0) -> Path:
    """A run without summary.json: its config.yaml and .owner lock file (and checkpoint.pt)."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"seed: {seed}\nrounds: 3\naggregator:\n  _target_: x.FedAvg\n")
    (folder / ".owner").write_text(f"{pid}\n")
    if checkpoint:
        (folder / "checkpoint.pt").write_bytes(b"")
    return folder
