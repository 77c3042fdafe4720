"""Per method, what its tuning had and what it gave: how many numbers it tuned with how many trials, its defaults'
validation score (its first trial) beside its choice's, and both on the confirm seeds' test set. A choice that
confirms worse than the defaults is flagged: it won on validation (never below the defaults there, by selection)
but lost on fresh seeds, so the tuning was overfit to its tuning seeds or its validation data."""

from __future__ import annotations

import statistics

from fedagg.compare.protocol import Protocol
from fedagg.compare.space import Param
from fedagg.results import render


def _mean(by_seed: dict) -> float | None:
    done = [v for status, v in by_seed.values() if status == "completed" and v is not None]
    return statistics.fmean(done) if done else None


def _pct(v: float | None) -> str:
    return "" if v is None else f"{100 * v:.2f}"


def worse_than_defaults(selection: list[dict], values: dict, protocol: Protocol) -> dict[str, tuple[float, float]]:
    """method -> (tuned, defaults) mean test metric over the confirm seeds, for each method whose chosen trial is
    not its defaults (trial 0) and confirms below them."""
    out = {}
    for m in protocol.methods:
        chosen = next((r for r in selection if r["method"] == m and r["chosen"]), None)
        tuned, defaults = _mean(values.get((m, "tuned"), {})), _mean(values.get((m, "defaults"), {}))
        if chosen and chosen["trial"] != 0 and tuned is not None and defaults is not None and tuned < defaults:
            out[m] = (tuned, defaults)
    return out


def method_table(selection: list[dict], spaces: dict[str, list[Param]], values: dict, protocol: Protocol,
                 names: dict[str, str]) -> render.Block:
    worse = worse_than_defaults(selection, values, protocol)
    rows = []
    for m in protocol.methods:
        trials = sorted((r for r in selection if r["method"] == m), key=lambda r: r["trial"])
        tuned_keys = [p.key for p in spaces.get(m, []) if not p.fixed]
        chosen = next((r for r in trials if r["chosen"]), None)
        defaults = next((r for r in trials if r["trial"] == 0), None)
        flag = (f"confirms worse than its defaults ({_pct(worse[m][0])} < {_pct(worse[m][1])})" if m in worse else
                "the defaults were chosen" if chosen is not None and chosen["trial"] == 0 else "")
        rows.append([names.get(m, m), f"{len(tuned_keys)} ({', '.join(tuned_keys)})" if tuned_keys else "0",
                     f"{len(trials)} of {protocol.budget if tuned_keys else 1}",
                     _pct(defaults["val_score"]) if defaults else "", "" if chosen is None else str(chosen["trial"]),
                     _pct(chosen["val_score"]) if chosen else "", _pct(_mean(values.get((m, "defaults"), {}))),
                     _pct(_mean(values.get((m, "tuned"), {}))), flag])
    return render.grid(["method", "tuned dimensions", "trials (budget)", "validation: defaults (trial 0)",
                        "chosen trial", "validation: chosen", "test: defaults", "test: tuned", "flag"], rows)
