"""The values a table shows: where a cell key is in summary.json, one spelling per value, number formats, a cell's mean ± std from its runs."""

from __future__ import annotations

import math
import statistics

DASH, CROSS = "—", "×"
# how soon a run reached target_acc: in rounds, or in simulated seconds on a clock (summary.json); lower is better,
# and a run that never reached it has no value (its cell shows the best accuracy instead)
TO_TARGET = ("rounds_to_target", "time_to_target")


MISSING = object()


def find(summary: dict, path: str):
    """The value at a dotted path, MISSING where the path is not there (None is a value)."""
    node = summary
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def lookup(summary: dict, path: str):
    """The value at a dotted path, None where the path is not there."""
    value = find(summary, path)
    return None if value is MISSING else value


def key_text(value) -> str:
    """One spelling per value, whether it came from YAML, JSON or a CSV cell: 100.0 -> '100'."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(int(value)) if float(value).is_integer() else repr(float(value))
    text = str(value).strip()
    try:
        return key_text(float(text)) if text not in ("nan", "inf", "-inf") else text
    except ValueError:
        return text


def number(text) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def fmt(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}"


def label(spec: dict, name: str, value: str) -> str:
    labels = (spec.get("labels") or {}).get(name) or {}
    return str(labels.get(value, labels.get(str(value), value)))


def measure(runs: list[dict], spec: dict) -> dict:
    """Mean, std and the cell's text from the runs of one cell."""
    metric, scale, d = spec["metric"], 100.0 if spec["percent"] else 1.0, spec["decimals"]
    done = [r for r in runs if r.get("status") == "completed"]
    diverged = [r for r in runs if r.get("status") == "diverged"]
    out = {"n_runs": len(runs), "n_completed": len(done), "n_diverged": len(diverged),
           "n_other": len(runs) - len(done) - len(diverged), "mean": None, "std": None,
           "seeds": " ".join(str(r.get("seed")) for r in sorted(done, key=lambda r: (str(type(r.get("seed"))), r.get("seed"))))}
    if not done:
        out["text"] = CROSS if diverged else DASH
        return out
    values = [number(r.get(metric)) for r in done]
    reached = [v * scale for v in values if v is not None]
    infinite = sum(1 for r in done if r.get(metric) == math.inf)  # ε without noise: a value, not a missing one
    if infinite:
        out["text"] = "∞" if infinite == len(done) else f"∞ ({infinite}/{len(done)} runs)"
    elif not reached and metric not in TO_TARGET:
        out["text"] = DASH  # completed without a value (never evaluated)
    elif not reached:  # the target never reached: report the best accuracy, as FedAdp's table does
        best = statistics.fmean(100.0 * (number(r.get("best_test_acc")) or 0.0) for r in done)
        out["text"] = f"N/A ({best:.2f}%)"
    else:
        out["mean"] = statistics.fmean(reached)
        out["std"] = statistics.stdev(reached) if len(reached) > 1 else None
        spread = out["std"]
        if spec.get("spread") == "ci95" and spread is not None:  # the half-width of the mean's 95% t interval
            from scipy import stats  # noqa: PLC0415 - only tables that ask for intervals need scipy here
            spread = out["ci95"] = float(stats.t.ppf(0.975, len(reached) - 1)) * spread / math.sqrt(len(reached))
        out["text"] = fmt(out["mean"], d) + (f" ± {fmt(spread, d)}" if spread is not None else "")
        if len(reached) < len(done):
            out["text"] += f" ({len(reached)}/{len(done)} reached)"
    if diverged:
        out["text"] += f" ({len(diverged)}/{len(runs)} {CROSS})"
    return out
