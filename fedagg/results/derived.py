"""Metrics computed from a run's files rather than read from its summary.json, and how each convention reads.

- `last_k_test_acc`: the mean test accuracy over the last k evaluated rounds (metrics.csv),
  k = ⌈R/10⌉ for a run of R rounds unless given; smoother than the final round's value, and,
  unlike the best round's, not chosen by looking at the test set. Needs no new runs. A table
  whose paper averages a window of rounds (FedOpt's last 100, whatever the evaluation period)
  says so with `table.last_rounds: W`: the mean over the evaluations of rounds R−W+1..R.
- `final_client_jain`: Jain's fairness index (Σa)² / (n Σa²) of the clients' accuracies at the
  last per-client evaluation (clients.csv): 1 when every client is as accurate, 1/n when one
  client has it all.
- `final_client_acc_gap10`: the mean accuracy of the best 10% of clients minus that of the
  worst 10% (⌈n/10⌉ clients each, so at least one), at the same evaluation.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from fedagg.results.values import lookup, number

LAST_K, JAIN, GAP = "last_k_test_acc", "final_client_jain", "final_client_acc_gap10"
DERIVED = (LAST_K, JAIN, GAP)

CONVENTIONS = {
    "final_test_acc": "final: the test accuracy of the model after the last round",
    "best_test_acc": ("best: the highest test accuracy over the evaluated rounds; the round is selected on the test "
                      "set itself (test-set selection), so it overstates what a method would reach"),
    "rounds_to_target": "the first round whose test accuracy reaches the target",
    "time_to_target": ("the simulated seconds (sim_time, clock=...) at the end of the first evaluated round whose test "
                       "accuracy reaches the target"),
    "final_sim_time": "the simulated seconds (clock=...) at the end of the last round",
    JAIN: "Jain's index (Σa)² / (n Σa²) of the clients' accuracies at the last per-client evaluation (1: all equal)",
    GAP: "the mean accuracy of the best 10% of clients minus that of the worst 10%, at the last per-client evaluation",
}


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def last_k(accuracies: list[float], rounds: int, k: int | None = None) -> tuple[float | None, int]:
    """(mean of the last k accuracies, k); k defaults to ⌈rounds/10⌉ and is at least 1."""
    k = k if k is not None else max(1, math.ceil(rounds / 10))
    tail = accuracies[-k:]
    return (sum(tail) / len(tail) if tail else None), k


def last_rounds(evaluated: list[tuple[int, float]], window: int) -> tuple[float | None, int]:
    """(mean of the accuracies evaluated in the last `window` rounds of the run, how many there are): the window
    ends at the last evaluated round, so at R = 4000 and eval_every 10 a 100-round window holds 10 evaluations."""
    if not evaluated:
        return None, 0
    end = max(r for r, _ in evaluated)
    tail = [a for r, a in evaluated if r > end - window]
    return sum(tail) / len(tail), len(tail)


def window_of(run: dict) -> int | None:
    """The table's window in rounds (config.table.last_rounds), if its experiment file sets one."""
    window = lookup(run, "config.table.last_rounds")
    return int(window) if window is not None else None


def jain(values: list[float]) -> float | None:
    square = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * square) if values and square > 0 else None


def gap10(values: list[float]) -> float | None:
    if not values:
        return None
    ordered, n = sorted(values), math.ceil(len(values) / 10)
    return sum(ordered[-n:]) / n - sum(ordered[:n]) / n


def add_derived(run: dict, k: int | None = None) -> dict:
    """Set the derived metrics on a run's dict (read_run's), from the files in its folder; None where they lack."""
    run_dir = run.get("_path")
    if run_dir is None:
        return run
    evaluated = [(int(float(r["round"])), number(r.get("test_acc"))) for r in _rows(Path(run_dir) / "metrics.csv")]
    accuracies = [a for _, a in sorted(evaluated) if a is not None]
    rounds = number(run.get("rounds_completed")) or (evaluated[-1][0] if evaluated else 0)
    window = window_of(run) if k is None else None  # --last-k (evaluations) overrides the table's window
    if accuracies and window is not None:
        run[LAST_K], run["last_k"] = last_rounds([(r, a) for r, a in sorted(evaluated) if a is not None], window)
        run["last_rounds"] = window
    elif accuracies:
        run[LAST_K], run["last_k"] = last_k(accuracies, int(rounds), k)
    clients = _rows(Path(run_dir) / "clients.csv")
    if clients:
        last = max(int(float(r["round"])) for r in clients)
        values = [a for r in clients if int(float(r["round"])) == last and (a := number(r.get("test_acc"))) is not None]
        run[JAIN], run[GAP] = jain(values), gap10(values)
    return run


def convention(metric: str, runs: list[dict]) -> str:
    """The header line that says which value a table shows."""
    if metric == LAST_K:
        ks = sorted({run["last_k"] for run in runs if "last_k" in run})
        rounds = sorted({key for run in runs if (key := number(run.get("rounds_completed"))) is not None})
        shown = ", ".join(str(k) for k in ks) or "?"
        of = f" of runs of {', '.join(str(int(r)) for r in rounds)} rounds" if rounds else ""
        windows = sorted({run["last_rounds"] for run in runs if "last_rounds" in run})
        if windows:
            return (f"Metric: {metric} (the mean test accuracy over the last {', '.join(map(str, windows))} rounds: "
                    f"k = {shown} evaluated rounds{of}; the table's window, table.last_rounds; --last-k K averages "
                    "the last K evaluated rounds instead).")
        return (f"Metric: {metric} (last_k: the mean test accuracy over the last k = {shown} evaluated rounds{of}; "
                "k = ⌈R/10⌉ unless --last-k is given).")
    text = CONVENTIONS.get(metric)
    return f"Metric: {metric}" + (f" ({text})." if text else ", as each run's summary.json has it.")
