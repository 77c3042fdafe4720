"""What a table refuses to show, each in one line (ResultsError), and the number format that fits a metric.

A table is honest when each cell pools only runs that differ in their seed, when its rows
and columns are keys the runs have, and when its metric is one the runs report; otherwise
it would print a number that means something else (four runs of two systems "over seeds
(0, 1)", one unnamed row of every method, `N/A` for a misspelt metric).
"""

from __future__ import annotations

import math

from fedagg.results.groups import GROUPS, RECORDED_CHOICES
from fedagg.results.runs import ResultsError, overrides_of
from fedagg.results.values import MISSING, find

# overrides that say where files are or how a run is carried out, not what it computes: never a reason to refuse
NOT_SETTINGS = ("data.root", "data.download", "resume", "threads", "checkpoint_every", "logger")


def check_keys(runs: list[dict], spec: dict, given: dict[str, str]) -> None:
    """Refuse a row or column key (given: name -> its option, --rows or --columns) that no run has."""
    for name, option in given.items():
        path = spec["keys"][name]
        if all(find(run, path) is MISSING for run in runs):
            raise ResultsError(f"{option} {name}: no run has {path}; use a group ({', '.join(GROUPS)}), a config key "
                               f"such as partition.alpha, or --key {name}=PATH to say where it is in summary.json")


def check_metric(runs: list[dict], spec: dict, given: str | None) -> None:
    """Refuse a metric that no completed run has in its summary.json."""
    done = [run for run in runs if run.get("status") == "completed"]
    metric = spec["metric"]
    if not done or any(metric in run for run in done):
        return
    have = sorted({k for run in done for k, v in run.items() if not k.startswith("_") and is_number(v)})
    hint = " (per-client metrics need runs with eval.per_client=true)" if "client" in metric else ""
    raise ResultsError(f"--metric {given or metric}: no completed run has {metric} in its summary.json{hint}; "
                       f"they have {', '.join(have)}")


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_accuracy(metric: str) -> bool:
    """test_acc, final_test_acc, best_test_acc, final_client_acc_p10, ...: fractions shown as percentages."""
    return metric.endswith("_acc") or "_acc_" in metric


def number_format(runs: list[dict], metric: str) -> tuple[bool, int]:
    """(as a percentage, decimals) for a metric: accuracies as percentages with 2 decimals, counts without
    decimals, anything else with three significant digits of its largest value."""
    if is_accuracy(metric):
        return True, 2
    values = [abs(float(run[metric])) for run in runs if is_number(run.get(metric)) and math.isfinite(run[metric])]
    if metric == "rounds_to_target" or not values or all(float(v).is_integer() for v in values):
        return False, 0
    largest = max(values)
    return False, min(4, max(0, 2 - math.floor(math.log10(largest)))) if largest > 0 else 0


def settings_of(run: dict, spec: dict) -> dict:
    """The run's group choices and command-line overrides, less the seed and what the table's cells are keyed by."""
    paths = set(spec["keys"].values())
    names = set(spec["rows"]) | set(spec["columns"])
    choices = {g: v for g, v in (run.get("choices") or {}).items() if g in RECORDED_CHOICES}
    out = {g: v for g, v in choices.items() if f"choices.{g}" not in paths and g not in names and g != "logger"}
    for key, value in overrides_of(run).items():
        if key == "seed" or key.startswith(NOT_SETTINGS) or key in names or f"config.{key}" in paths or f"choices.{key}" in paths or key in choices:
            continue
        out[key] = value
    return out


def check_cells(cells: dict[tuple, list[dict]], spec: dict, name) -> None:
    """Refuse cells that pool runs of different settings, or two completed runs of one seed."""
    for cell, runs in cells.items():
        settings = [settings_of(run, spec) for run in runs]
        keys = dict.fromkeys(k for s in settings for k in s)
        varying = {k: sorted({str(s.get(k)) for s in settings}) for k in keys if len({str(s.get(k)) for s in settings}) > 1}
        if varying:
            listed = ", ".join(f"{k} ({', '.join(v)})" for k, v in varying.items())
            first = next(iter(varying))
            raise ResultsError(f"the cell {name(cell)} pools runs that differ in {listed}, which is neither a row, a "
                               f"column nor the seed: add it (--columns {' '.join([*spec['columns'], first])}) or "
                               "table each value apart")
        seen = {}
        for run in runs:
            if run.get("status") == "completed":
                seen.setdefault(str(run.get("seed")), []).append(run["_dir"])
        twice = {s: dirs for s, dirs in seen.items() if len(dirs) > 1}
        if twice:
            seed, dirs = next(iter(twice.items()))
            raise ResultsError(f"the cell {name(cell)} has {len(dirs)} completed runs of seed {seed} "
                               f"({', '.join(dirs)}): remove the copies or table them apart")
