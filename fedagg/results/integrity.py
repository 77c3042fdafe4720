"""Whether a run's CSV files are the ones the run wrote: a damaged file is named and its run left out.

A metrics.csv cut short, edited or half overwritten still parses, and a table's last-k mean
or a plot would quietly change with it. Each file is held against what the run itself
recorded: every row has the header's fields; rounds are whole, increasing and exactly the
evaluated ones (every `eval_every`-th and the last, per summary.json's `rounds_completed`);
accuracies are numbers in [0, 1]; the last row's accuracy is summary.json's final one.
weights.csv: whole fields, rounds within the run, weights that are finite and non-negative.
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

from fedagg.results.values import number

CHECKED = ("metrics.csv", "weights.csv")
ACCURACIES = ("test_acc", "val_acc")


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    return (lines[0], lines[1:]) if lines else ([], [])


def _whole(text: str) -> int | None:
    value = number(text)
    return int(value) if value is not None and value.is_integer() else None


def _evaluated_rounds(last: int, every: int) -> list[int]:
    return sorted({r for r in range(every, last + 1, every)} | {last})


def metrics_problem(path: Path, run: dict) -> str | None:
    header, rows = _rows(path)
    if "round" not in header:
        return "no round column"
    for n, row in enumerate(rows, start=2):
        if len(row) != len(header):
            return f"line {n} has {len(row)} fields, the header {len(header)}"
    at = {name: header.index(name) for name in ("round", *ACCURACIES) if name in header}
    rounds = [_whole(row[at["round"]]) for row in rows]
    if None in rounds:
        return f"line {rounds.index(None) + 2}: round {rows[rounds.index(None)][at['round']]!r} is not a whole number"
    if any(b <= a for a, b in zip(rounds, rounds[1:])):
        return "its rounds do not increase"
    for name in ACCURACIES:
        for n, row in enumerate(rows, start=2):
            text = row[at[name]] if name in at else ""
            value = number(text)
            if text != "" and (value is None or not 0 <= value <= 1):
                return f"line {n}: {name} {text!r} is not an accuracy in [0, 1]"
    status, completed = run.get("status"), number(run.get("rounds_completed"))
    every = number((run.get("config") or {}).get("eval_every"))
    if status == "completed" and completed and every and every.is_integer() and every >= 1:
        expected = _evaluated_rounds(int(completed), int(every))
        if rounds != expected:
            missing = sorted(set(expected) - set(rounds))
            extra = sorted(set(rounds) - set(expected))
            what = f"round {missing[0]} is missing" if missing else f"round {extra[0]} was never evaluated"
            return f"{what} (summary.json: {int(completed)} rounds, every {int(every)} evaluated)"
        for name in ACCURACIES:
            final = number(run.get(f"final_{name}"))
            last = number(rows[-1][at[name]]) if name in at and rows else None
            if final is not None and (last is None or not math.isclose(last, final, rel_tol=0, abs_tol=1e-12)):
                return f"its last {name} {rows[-1][at[name]] if name in at else ''!r} is not summary.json's final_{name} {final!r}"
    return None


def weights_problem(path: Path, run: dict) -> str | None:
    header, rows = _rows(path)
    if not {"round", "client", "weight"} <= set(header):
        return "it lacks the round, client and weight columns"
    at = {name: header.index(name) for name in ("round", "client", "weight")}
    completed = number(run.get("rounds_completed"))
    for n, row in enumerate(rows, start=2):
        if len(row) != len(header):
            return f"line {n} has {len(row)} fields, the header {len(header)}"
        r, client, weight = _whole(row[at["round"]]), _whole(row[at["client"]]), number(row[at["weight"]])
        if r is None or client is None or r < 1 or (completed is not None and r > completed):
            return f"line {n}: round {row[at['round']]!r} / client {row[at['client']]!r} is not one of the run's"
        if weight is None or weight < 0:
            return f"line {n}: weight {row[at['weight']]!r} is not a number >= 0"
    return None


PROBLEMS = {"metrics.csv": metrics_problem, "weights.csv": weights_problem}


def damage(run: dict) -> str | None:
    """Why a run's files cannot be trusted ("<path> is damaged: <why>"), or None. Only runs that wrote a
    summary.json are checked: a running or killed run's files are what they are."""
    folder = run.get("_path")
    if folder is None or not run.get("_has_summary", True):
        return None
    for name in CHECKED:
        path = Path(folder) / name
        if not path.exists() or path.stat().st_size == 0:
            continue
        try:
            problem = PROBLEMS[name](path, run)
        except (OSError, UnicodeDecodeError, csv.Error) as err:
            problem = f"{type(err).__name__}: {err}"
        if problem:
            return f"{path} is damaged: {problem}"
    return None


def sound(runs: list[dict], stream=None) -> list[dict]:
    """The runs whose files are sound; one warning line (stderr) per run left out, naming the file and why."""
    kept = []
    for run in runs:
        problem = damage(run)
        if problem is None:
            kept.append(run)
        else:
            print(f"warning: {problem}; that run is left out", file=stream or sys.stderr)
    return kept
