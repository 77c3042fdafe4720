"""report.html of a comparison, built with the results layer (load_sweep, paired statistics, render): what was
compared, each method's tuning curve, the chosen values against their ranges, the test tables of the tuned
methods and of their defaults with paired intervals against the baseline, how the ranking moved, wall times."""

from __future__ import annotations

import csv
import html
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedagg.compare.protocol import Protocol, last_rounds, write_atomically  # noqa: E402
from fedagg.compare.space import Param  # noqa: E402
from fedagg.results import render, stats  # noqa: E402
from fedagg.results.report import STYLE, image  # noqa: E402
from fedagg.results.runs import load_sweep  # noqa: E402

METRIC = "last_k_test_acc"  # the test counterpart of the selection score: mean over the last ceil(R/10) evaluations


def read_selection(folder: Path) -> list[dict]:
    with open(folder / "selection.csv", newline="") as f:
        return [{**r, "trial": int(r["trial"]), "params": json.loads(r["params"]), "val_score": float(r["val_score"]),
                 "chosen": r["chosen"] == "true"} for r in csv.DictReader(f)]


def test_values(folder: Path, protocol: Protocol, kind: str) -> dict[str, dict[int, float]]:
    """method -> {seed: test metric} of the confirm runs of one kind (tuned or default)."""
    out = {}
    for m in protocol.methods:
        frame = load_sweep(folder / "confirm" / kind / m)
        done = frame[frame["status"] == "completed"] if "status" in frame else frame
        out[m] = {int(s): float(v) for s, v in zip(done["seed"], done[METRIC]) if v == v}
    return out


def _ranks(values: dict[str, dict[int, float]]) -> dict[str, float]:
    ranks, _ = stats.average_ranks(values)
    return ranks


def test_table(values: dict[str, dict[int, float]], baseline: str) -> render.Block:
    ranks = _ranks(values)
    rows = []
    for m, by_seed in values.items():
        v = list(by_seed.values())
        mean = sum(v) / len(v) if v else math.nan
        std = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else 0.0
        d = stats.paired_difference(by_seed, values[baseline]) if m != baseline else None
        diff = "baseline" if d is None else (
            f"{100 * d.mean:+.2f}" + (f" [{100 * d.low:+.2f}, {100 * d.high:+.2f}] ({d.interval}, n={d.n})" if d.low is not None else ""))
        sig = "" if d is None else ("yes" if d.excludes_zero else "no")
        rows.append([m, f"{100 * mean:.2f} ± {100 * std:.2f}", diff, sig, f"{ranks.get(m, math.nan):.2f}"])
    return render.grid(["method", "test acc % (mean ± sd over seeds)", f"paired difference to {baseline} (pp, 95%)",
                        "interval excludes 0", "average rank"], rows)


def tuning_curves(selection: list[dict], protocol: Protocol, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    for m in protocol.methods:
        scores = [r["val_score"] for r in sorted((r for r in selection if r["method"] == m), key=lambda r: r["trial"])]
        best = [max(scores[: i + 1]) for i in range(len(scores))]
        ax.plot(range(1, len(best) + 1), [100 * b for b in best], marker="o", ms=3, label=m)
    ax.set_xlabel("trials")
    ax.set_ylabel("best validation score so far (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def chosen_table(selection: list[dict], spaces: dict[str, list[Param]]) -> render.Block:
    rows = []
    for r in (r for r in selection if r["chosen"]):
        for p in spaces[r["method"]]:
            value = r["params"].get(p.key)
            t = p.tune
            edge = "at the edge: the best may lie outside" if value is not None and t.at_edge(value) else ""
            chosen = f"{value:.4g}" if value is not None else "fixed by the command line" if p.fixed else ""
            rows.append([r["method"], p.key, f"[{t.low:g}, {t.high:g}]", "log" if t.log else "linear",
                         f"{p.default}", chosen, edge, t.source])
    return render.grid(["method", "setting", "range", "scale", "default", "chosen", "edge", "source of the range"], rows)


def wall_times(folder: Path, protocol: Protocol, invocation: dict[str, float]) -> render.Block:
    rows = []
    for stage in ("tune", "confirm"):
        total = 0.0
        for m in protocol.methods:
            frame = load_sweep(folder / stage / m) if stage == "tune" else None
            if stage == "confirm":
                frames = [load_sweep(folder / "confirm" / k / m) for k in ("tuned", "default")]
                s = sum(float(f["wall_time_s"].fillna(0).sum()) for f in frames if "wall_time_s" in f)
            else:
                s = float(frame["wall_time_s"].fillna(0).sum()) if "wall_time_s" in frame else 0.0
            rows.append([stage, m, f"{s:.1f}"])
            total += s
        rows.append([stage, "all", f"{total:.1f}"])
    rows += [[k, "", f"{v:.1f}"] for k, v in invocation.items()]
    return render.grid(["stage", "method", "seconds (sum of the runs' wall_time_s; last rows: this command's clock)"], rows)


def write_report(folder: Path, protocol: Protocol, spaces: dict[str, list[Param]], invocation: dict[str, float]) -> Path:
    selection = read_selection(folder)
    tuned, default = test_values(folder, protocol, "tuned"), test_values(folder, protocol, "default")
    rank_t, rank_d = _ranks(tuned), _ranks(default)
    moved = render.grid(["method", "rank with defaults", "rank tuned", "moved"],
                        [[m, f"{rank_d.get(m, math.nan):.2f}", f"{rank_t.get(m, math.nan):.2f}",
                          f"{rank_d.get(m, math.nan) - rank_t.get(m, math.nan):+.2f}"] for m in protocol.methods])
    p = protocol
    what = (f"Methods {', '.join(p.methods)}; {p.budget} trials each (the same sampler, seed {p.sampler_seed}), "
            f"on tuning seeds {list(p.tune_seeds)}, scored on "
            + ("the clients' validation splits (client.val_frac" if p.validation == "split" else
               f"held-out clients ({p.held_out:.0%} of the clients, never trained on, in every run")
            + f"; the test set is never read while tuning) by the mean validation accuracy of the last ceil(R/10) "
            f"evaluated rounds. Each method's best trial and its defaults were run on confirm seeds "
            f"{list(p.confirm_seeds)}, scored on the test set by {METRIC} (the same last-rounds mean). "
            f"Run settings: {' '.join(json.loads((folder / 'protocol.json').read_text())['arguments']) or '(defaults)'}.")
    work = folder / "report_files"
    work.mkdir(exist_ok=True)
    sections = [
        ("What was compared", f"<p>{html.escape(what)}</p>"),
        ("Tuning curves", image(tuning_curves(selection, p, work / "tuning.png"), "tuning curves")),
        ("Chosen values against their ranges", render.Table([chosen_table(selection, spaces)]).to_html()),
        (f"Test: tuned (paired against tuned {p.baseline})", render.Table([test_table(tuned, p.baseline)]).to_html()),
        (f"Test: defaults (paired against {p.baseline} at its defaults)", render.Table([test_table(default, p.baseline)]).to_html()),
        ("How tuning moved the ranking", render.Table([moved]).to_html()),
        ("Wall time", render.Table([wall_times(folder, p, invocation)]).to_html()),
    ]
    body = "".join(f"<section><h2>{html.escape(h)}</h2>{b}</section>" for h, b in sections)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>fair comparison</title><style>{STYLE}</style>"
            f"</head><body><h1>fedagg fair comparison: {html.escape(folder.name)}</h1>{body}</body></html>")
    write_atomically(folder / "report.html", page)
    return folder / "report.html"


__all__ = ["write_report", "read_selection", "test_values", "last_rounds"]
