"""report.html of a comparison, built with the results layer (the same table, statistics and figure that
`python -m fedagg.results table|plot <comparison folder>` give): what was compared, each method's tuning curve,
the chosen values against their ranges, the confirm table of the tuned methods and of their defaults side by side
with paired intervals against the baseline and how tuning moved the ranking, every confirm run's value by seed
(a chosen configuration whose seeds disagree is flagged), the methods' curves, and the time spent. Beside it:
`table.tex` (the LaTeX table; on a clock with a target_acc, `table_time.tex`: the time to reach it) and
`methods.pdf`/`methods.png` (the figure), ready for a paper."""

from __future__ import annotations

import csv
import html
import json
import logging
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedagg.compare.protocol import Protocol, last_rounds, write_atomically  # noqa: E402
from fedagg.compare.space import Param  # noqa: E402
from fedagg.compare.verdict import method_table, worse_than_defaults  # noqa: E402
from fedagg.results import comparison, render, stats  # noqa: E402
from fedagg.results.figure import colors, comparison_figure  # noqa: E402
from fedagg.results.derived import LAST_K, add_derived  # noqa: E402
from fedagg.results.report import STYLE, image  # noqa: E402
from fedagg.results.runs import ResultsError  # noqa: E402
from fedagg.results.table import build_table  # noqa: E402
from fedagg.results.timing import spent  # noqa: E402
from fedagg.results.values import number  # noqa: E402

log = logging.getLogger("fedagg")
METRIC = LAST_K  # the test counterpart of the selection score: mean over the last ceil(R/10) evaluations
FRAGILE_SD = 3.0  # a confirm seed this many seed-to-seed standard deviations below the mean of its other seeds ...
FRAGILE_FLOOR = 0.01  # ... and at least this far (1 percentage point) below it is flagged


def read_selection(folder: Path) -> list[dict]:
    with open(folder / "selection.csv", newline="") as f:
        return [{**r, "trial": int(r["trial"]), "params": json.loads(r["params"]), "val_score": float(r["val_score"]),
                 "chosen": r["chosen"] == "true"} for r in csv.DictReader(f)]


def confirm_values(runs: list[dict], protocol: Protocol) -> dict[tuple[str, str], dict[int, tuple[str, float | None]]]:
    """(method, tuned|defaults) -> {seed: (status, test metric)} of the confirm runs, the metric as the table has it."""
    out: dict[tuple[str, str], dict] = {(m, k): {} for m in protocol.methods for _, k in comparison.KINDS}
    for run in runs:
        key = (run.get("method"), run.get(comparison.TUNING))
        if key in out:
            out[key][run.get("seed")] = (run.get("status"), number(run.get(METRIC)))
    return out


def seed_noise(values: dict) -> float:
    """The comparison's seed-to-seed standard deviation: the median over its configurations (method, tuned or
    defaults) of the sd of their completed seeds. A median, so that the one fragile configuration being looked for
    does not widen the yardstick it is measured by; three seeds of one configuration give too rough an sd alone."""
    sds = [statistics.stdev(v) for by_seed in values.values()
           if len(v := [x for status, x in by_seed.values() if status == "completed" and x is not None]) >= 2]
    return statistics.median(sds) if sds else 0.0


def fragile(by_seed: dict[int, tuple[str, float | None]], noise: float) -> list[str]:
    """Why a configuration's confirm seeds disagree: a run that diverged or did not finish, or a seed more than
    FRAGILE_SD times the comparison's seed noise (and FRAGILE_FLOOR) below the mean of its other seeds."""
    reasons = [f"seed {s} {status}" for s, (status, _) in sorted(by_seed.items()) if status != "completed"]
    done = {s: v for s, (status, v) in by_seed.items() if status == "completed" and v is not None}
    for s, v in sorted(done.items()):
        others = [x for t, x in done.items() if t != s]
        if others and v < statistics.fmean(others) - max(FRAGILE_SD * noise, FRAGILE_FLOOR):
            reasons.append(f"seed {s}: {100 * v:.2f}, the others {', '.join(f'{100 * x:.2f}' for x in others)}")
    return reasons


def per_seed_table(values: dict, protocol: Protocol, names: dict[str, str]) -> render.Block:
    """Every confirm run's test metric by seed, and a flag where a configuration's seeds disagree."""
    rows, noise = [], seed_noise(values)
    for (m, kind), by_seed in values.items():
        cells = []
        for s in protocol.confirm_seeds:
            status, v = by_seed.get(s, ("not run", None))
            cells.append(f"{100 * v:.2f}" if status == "completed" and v is not None else status)
        rows.append([names.get(m, m), kind, *cells, "; ".join(fragile(by_seed, noise)) or ""])
    return render.grid(["method", "configuration", *(f"seed {s}" for s in protocol.confirm_seeds),
                        "seeds disagree (flag)"], rows)


def tuning_curves(selection: list[dict], protocol: Protocol, path: Path, names: dict[str, str]) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    palette = colors(protocol.methods)  # each method in its colour of the other figures
    for m in protocol.methods:
        scores = [r["val_score"] for r in sorted((r for r in selection if r["method"] == m), key=lambda r: r["trial"])]
        best = [max(scores[: i + 1]) for i in range(len(scores))]
        ax.plot(range(1, len(best) + 1), [100 * b for b in best], marker="o", ms=3, label=names.get(m, m),
                color=palette[m])
    ax.set_xlabel("trials (the first: each method's defaults)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # trials are counted, never 1.5
    ax.set_ylabel("best validation score so far (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def chosen_table(selection: list[dict], spaces: dict[str, list[Param]], names: dict[str, str] | None = None) -> render.Block:
    rows = []
    for r in (r for r in selection if r["chosen"]):
        for p in spaces[r["method"]]:
            value = r["params"].get(p.key)
            t = p.tune
            edge = "at the edge: the best may lie outside" if value is not None and t.at_edge(value) else ""
            chosen = f"{value:.4g}" if value is not None else "fixed by the command line" if p.fixed else ""
            rows.append([(names or {}).get(r["method"], r["method"]), p.key, f"[{t.low:g}, {t.high:g}]", "log" if t.log else "linear",
                         f"{p.default}", chosen, edge, t.source])
    return render.grid(["method", "setting", "range", "scale", "default", "chosen", "edge", "source of the range"], rows)


def wall_times(folder: Path, protocol: Protocol, invocation: dict[str, float], names: dict[str, str]) -> render.Block:
    """The time each stage's runs took on the clock: the union of their [start, end] intervals, so runs that
    ran at once (joblib, a stacked group whose jobs each report the group's time) count once."""
    rows = []
    for stage, parts in (("tune", [("tune",)]), ("confirm", [("confirm", "tuned"), ("confirm", "default")])):
        everything = []
        for m in protocol.methods:
            runs = [r for part in parts for r in comparison.runs_below(folder.joinpath(*part, m))]
            everything += runs
            rows.append([stage, names.get(m, m), f"{spent(runs):.1f}"])
        rows.append([stage, "all methods", f"{spent(everything):.1f}"])
    rows += [[k, "", f"{v:.1f}"] for k, v in invocation.items()]
    return render.grid(["stage", "method", "seconds spent (the runs' time on the clock, runs at once counted once; "
                        "last rows: this command's own clock)"], rows)


def write_report(folder: Path, protocol: Protocol, spaces: dict[str, list[Param]], invocation: dict[str, float]) -> Path:
    selection = read_selection(folder)
    p = protocol
    try:
        table = build_table(folder)
    except ResultsError as err:  # no confirm run finished: the page says so, the rest is still worth reading
        table, problem = None, str(err)
    names = dict((table.spec.get("labels") or {}).get("method") or {}) if table else {}
    runs = comparison.confirm_runs(folder)
    for run in runs:
        add_derived(run)
    values = confirm_values(runs, p)
    noise = seed_noise(values)
    flagged = {(m, k): why for (m, k), by_seed in values.items() if (why := fragile(by_seed, noise))}
    counts = {m: sum(1 for r in selection if r["method"] == m) for m in p.methods}
    fewer = [f"{names.get(m, m)} {n}" for m, n in counts.items() if n != p.budget]
    trials = f"{p.budget} trials each" + (f" (but {', '.join(fewer)}: nothing left to tune)" if fewer else "")
    if fixed := sorted({q.key for m in p.methods for q in spaces.get(m, []) if q.fixed}):
        trials += f"; fixed by the command line, not tuned: {', '.join(fixed)}"
    what = (f"Methods {', '.join(names.get(m, m) for m in p.methods)}; {trials} (the same design for every method: its "
            f"defaults first, then points of a scrambled Sobol sequence, seed {p.sampler_seed}, in its own ranges), on tuning seeds {list(p.tune_seeds)}, scored on "
            + ("the clients' validation splits (client.val_frac" if p.validation == "split" else
               f"held-out clients ({p.held_out:.0%} of the clients, never trained on, in every run")
            + f"; the test set is never read while tuning) by the mean validation accuracy of the last ceil(R/10) "
            f"evaluated rounds. Each method's best trial and its defaults were run on confirm seeds "
            f"{list(p.confirm_seeds)}, scored on the test set by {METRIC}: the mean test accuracy of the same last "
            f"ceil(R/10) evaluated rounds, the metric `python -m fedagg.results table` shows by default. "
            f"{stats.rank_definition('setting')} "
            f"Run settings: {' '.join(comparison.read_protocol(folder / comparison.PROTOCOL)['arguments']) or '(defaults)'}.")
    work = folder / "report_files"
    work.mkdir(exist_ok=True)
    warning = ""
    if flagged:
        items = "".join(f"<li>{html.escape(names.get(m, m))} ({k}): {html.escape('; '.join(why))}</li>"
                        for (m, k), why in flagged.items())
        warning = (f"<p><strong>Configurations whose confirm seeds disagree</strong> (a run that diverged, or a seed "
                   f"more than {FRAGILE_SD:g} × {100 * noise:.2f} points, the comparison's seed-to-seed sd, and at least "
                   f"{100 * FRAGILE_FLOOR:g} point below its other seeds): a fragile "
                   f"choice; confirm on more seeds, or tune on two seeds (tune_seeds=[0,1]).</p><ul>{items}</ul>")
    worse = worse_than_defaults(selection, values, p)
    if worse:
        items = "".join(f"<li>{html.escape(names.get(m, m))}: tuned {100 * t:.2f}, defaults {100 * d:.2f}</li>"
                        for m, (t, d) in worse.items())
        warning += (f"<p><strong>Tuned choices that confirm worse than their defaults</strong> (the mean of "
                    f"{METRIC} over the confirm seeds; on validation the choice scored at least as well as the "
                    f"defaults, its first trial):</p><ul>{items}</ul>")
    sections = [("What was compared", f"<p>{html.escape(what)}</p>{warning}"),
                ("Tuning per method", render.Table([method_table(selection, spaces, values, p, names)]).to_html()),
                ("Tuning curves", image(tuning_curves(selection, p, work / "tuning.png", names), "tuning curves")),
                ("Chosen values against their ranges", render.Table([chosen_table(selection, spaces, names)]).to_html())]
    if table is not None:
        sections.append(("Test: tuned and at defaults", table.to_html()))
        write_atomically(folder / "table.tex", table.to_latex())
    else:
        sections.append(("Test: tuned and at defaults", f"<p>{html.escape(problem)}</p>"))
    if any(r.get("target_acc") is not None and "time_to_target" in r for r in runs):  # on a clock, with a target
        timed = build_table(folder, metric="time_to_target")
        sections.append(("Time to the target accuracy", timed.to_html()))
        write_atomically(folder / "table_time.tex", timed.to_latex())
    sections.append(("Every confirm run, by seed", render.Table([per_seed_table(values, p, names)]).to_html()))
    curves = comparison_figure(folder)
    if curves:
        sections.append(("Test accuracy of the tuned methods", image(curves[-1], "methods")))
    sections.append(("Time spent", render.Table([wall_times(folder, p, invocation, names)]).to_html()))
    body = "".join(f"<section><h2>{html.escape(h)}</h2>{b}</section>" for h, b in sections)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>fair comparison</title><style>{STYLE}</style>"
            f"</head><body><h1>fedagg fair comparison: {html.escape(folder.name)}</h1>{body}</body></html>")
    write_atomically(folder / "report.html", page)
    for m, (t, d) in worse.items():
        log.warning("%s: its tuned choice confirms worse than its defaults (%.2f < %.2f); see report.html",
                    names.get(m, m), 100 * t, 100 * d)
    for (m, k), why in flagged.items():
        log.warning("%s (%s): its confirm seeds disagree (%s); see report.html", names.get(m, m), k, "; ".join(why))
    return folder / "report.html"


__all__ = ["write_report", "read_selection", "confirm_values", "fragile", "seed_noise", "last_rounds"]
