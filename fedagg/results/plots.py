"""Curves of a set of runs: test accuracy, FedNNNN's N/E update norms, per-client weights.

    python -m fedagg.results plot outputs/tables/fednnnn_table2/2025-01-01_12-00-00
    python -m fedagg.results plot outputs/2025-01-01/10-00-00 outputs/2025-01-01/10-05-00 --out figs/

Takes run folders or folders with runs below them, and writes (into the one
folder given, or `--out`):
  accuracy.png      test accuracy per round, one line per method (mean over seeds, band = ±std)
  update_norms.png  N = ||w_{r+1} - w_r|| (solid) and E = sum_k p_k ||Delta_k|| (dashed) per round
  weights.png       every client's aggregation weight per round (weights.csv), one panel per run
  accuracy_bits.png test accuracy against the cumulative bits uploaded (left) and sent both ways (right),
                    log scale, from metrics.csv's bits_up_total and bits_down_total (runs that count them)
  accuracy_time.png test accuracy against the simulated time (left, metrics.csv's sim_time) and the client
                    updates aggregated (right, client_updates), for runs on a clock (clock=lognormal, ...)
  <COLUMN>.png      with --curve COLUMN: that metrics.csv column per round, as accuracy.png draws the accuracy
                    (e.g. --curve agg_error, the adapter rules' aggregation error); runs without it are left out
  methods.pdf/.png  of a comparison's folder: every tuned method on one axis (fedagg.results.figure), one column
                    (--width column, 3.3 in) or the page (--width page, 7 in) wide, TrueType fonts embedded
Runs of a table experiment are grouped as the table is: one panel per column cell, one
line per row (method); other runs get one line per method (its display name) and a panel per
setting they vary (a comparison's: tuned and defaults). When the runs logged to
Weights & Biases (logger=wandb), the PNGs are also logged to a new W&B run of the same
project and mode (offline by default: `wandb sync <out>/wandb/offline-run-*` uploads it).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedagg.results import comparison, integrity, wandb_log  # noqa: E402
from fedagg.results.figure import colors, comparison_figure, load_run, log_axis, read_csv, reweights  # noqa: E402,F401  (read_csv, reweights: report's)
from fedagg.results.checks import NOT_SETTINGS  # noqa: E402
from fedagg.results.groups import RECORDED_CHOICES  # noqa: E402
from fedagg.results.runs import ResultsError, find_run_dirs, overrides_of, read_run, sweep_frame  # noqa: E402
from fedagg.results.values import key_text, label, lookup, number  # noqa: E402

PLOTS = ("accuracy.png", "update_norms.png", "weights.png", "accuracy_bits.png", "accuracy_time.png")
BITS = ((("bits_up_total",), "cumulative bits uploaded"), (("bits_up_total", "bits_down_total"), "cumulative bits, up and down"))
TIME = ((("sim_time",), "simulated time (s)"), (("client_updates",), "client updates aggregated"))
PER_STEP = "mean over seeds at each server step"  # what a point of a curve against time is: seeds' clocks differ


def found_runs(path: Path) -> list[dict]:
    """The runs a plot of `path` shows: a comparison's confirm runs (tuned and defaults), else every run below it."""
    return comparison.confirm_runs(path) if comparison.is_comparison(path) else [read_run(d, path) for d in find_run_dirs([path])]


def finished_runs(paths: list[Path]) -> tuple[list[dict], list[dict]]:
    """(the runs below paths that wrote a summary.json and whose files are sound, loaded, a comparison's in the order
    of its methods=; those that did not write one: running or killed). A damaged file is named in one warning line
    and its run left out."""
    found = [run for path in paths for run in found_runs(Path(path))]
    finished = integrity.sound([r for r in found if r["_has_summary"]])
    order = [m for path in paths for m in comparison.methods(Path(path))]
    finished.sort(key=lambda r: order.index(r.get("method")) if r.get("method") in order else len(order))
    return [load_run(r) for r in finished], [r for r in found if not r["_has_summary"]]


def palette(runs: list[dict], axes: list[str]) -> dict[str, str]:
    """Each line's colour by the order of the runs (finished_runs': the comparison's methods=), the same in every
    figure and panel."""
    return colors(describe(run, axes)[1] for run in runs)


def unfinished_note(unfinished: list[dict]) -> str:
    listed = ", ".join(f"{r['_path']} ({r['status']})" for r in unfinished[:10])
    return (f"{len(unfinished)} run(s) without a summary.json left out: {listed}{' …' if len(unfinished) > 10 else ''}")


RUN_KEYS = ("method", comparison.TUNING)  # cell keys a table reads from the run itself (fedagg.results.table's)
METHOD_KEYS = ("method", "method_name", "aggregator", "client/objective", "seed")  # what a line is, not a panel


def sweep_axes(runs: list[dict]) -> list[str]:
    """The settings a plain sweep varies besides the method and the seed (group choices, overridden keys,
    a comparison's tuned/defaults): each value gets its own panel (and table column), so that no line pools
    runs of different settings. A key that takes one value per method (a method's tuned client rate) belongs
    to the method: its line, not a panel of its own."""
    summaries = [run["summary"] for run in runs if not isinstance(lookup(run["summary"], "config.table"), dict)]
    if not summaries:
        return []
    frame = sweep_frame(summaries)
    if comparison.TUNING in summaries[0]:
        frame[comparison.TUNING] = [s.get(comparison.TUNING) for s in summaries]
    candidates = [g for g in RECORDED_CHOICES if g in frame] + frame.attrs["varying"] + [comparison.TUNING]
    axes = [c for c in dict.fromkeys(candidates) if c in frame and c not in METHOD_KEYS
            and not c.startswith(NOT_SETTINGS) and frame[c].astype(str).nunique() > 1]
    per_method = frame.groupby("method", dropna=False)
    return [c for c in axes if not (per_method[c].apply(lambda v: v.astype(str).nunique()) <= 1).all()]


def axis_value(summary: dict, axis: str):
    choices = summary.get("choices") or {}
    if axis in summary and axis not in choices:  # a comparison's `tuning`
        return summary[axis]
    return choices.get(axis) if axis in choices else overrides_of(summary).get(axis)


def describe(run: dict, axes: list[str] = ()) -> tuple[str, str]:
    """(panel title, line label) of a run: the table's column cell and row, else the sweep's other axes
    (`system=dropout`) and the aggregator."""
    s = run["summary"]
    spec = lookup(s, "config.table") or {}
    keys = spec.get("keys") or {}

    def text(names: list[str]) -> str:
        parts = []
        for name in names:
            path = keys.get(name, name if name in RUN_KEYS else f"choices.{name}")  # `method`: the run's own id
            parts.append(label(spec, name, key_text(lookup(s, path))))
        return " ".join(parts)

    if spec.get("rows"):
        return text(spec.get("columns") or []), text(spec["rows"])
    method = s.get("method_name") or s.get("method") or lookup(s, "config.aggregator._target_") or "?"
    panel = " ".join(str(axis_value(s, a)).capitalize() if a == comparison.TUNING else f"{a}={key_text(axis_value(s, a))}"
                     for a in axes)
    return panel, str(method).rsplit(".", 1)[-1]


NOT_PARAMS = ("_target_", "_partial_")  # how a YAML node is built, not what it chose


def setting_title(runs: list[dict], method: bool = True) -> str:
    """What the runs of a panel share, from their choices: the method (one only) and the dataset, over the partition
    and its parameters (`FedAvg · digits` over `dirichlet alpha=0.5 min_size=10`). A panel's title when the sweep
    varies nothing else, in place of the folder's name (a timestamp)."""
    def shared(text_of) -> str:
        texts = {text_of(run["summary"]) for run in runs}
        return texts.pop() if len(texts) == 1 else ""

    def partition(s: dict) -> str:
        params = lookup(s, "config.partition") or {}
        shown = [f"{k}={key_text(v)}" for k, v in params.items() if k not in NOT_PARAMS and v is not None
                 and not isinstance(v, (dict, list))]
        return " ".join([lookup(s, "choices.partition") or "", *shown]).strip()

    head = [shared(lambda s: str(s.get("method_name") or s.get("method") or "")) if method else "",
            shared(lambda s: lookup(s, "choices.dataset") or "")]
    return "\n".join(t for t in (" · ".join(p for p in head if p), shared(partition)) if t)


def series(runs: list[dict], column: str, scale: float = 1.0) -> tuple[list[int], list[float], list[float]]:
    """Mean and std over runs of one metrics column, on the rounds every run evaluated."""
    per_round = defaultdict(list)
    for run in runs:
        for row in run["metrics"]:
            value = number(row.get(column))
            if value is not None and number(row.get("round")) is not None:
                per_round[int(float(row["round"]))].append(value * scale)
    rounds = [r for r in sorted(per_round) if len(per_round[r]) == len(runs)] or sorted(per_round)
    means = [sum(per_round[r]) / len(per_round[r]) for r in rounds]
    stds = [math.sqrt(sum((v - m) ** 2 for v in per_round[r]) / max(len(per_round[r]) - 1, 1))
            for r, m in zip(rounds, means)]
    return rounds, means, stds


def grid(n: int) -> tuple[plt.Figure, list]:
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def plot_curves(groups: dict, out: Path, name: str, columns: list[tuple[str, str, float]], ylabel: str,
                palette: dict[str, str] | None = None) -> Path:
    """One panel per group; per line label the mean (and ±std band) of each metrics column.
    A label keeps its colour (`palette`'s, else by first appearance) in every panel."""
    line_colors = dict(palette or {})
    for lines in groups.values():
        for line in lines:
            line_colors.setdefault(line, f"C{len(line_colors) % 10}")
    fig, axes = grid(len(groups))
    for ax, (panel, lines) in zip(axes, groups.items()):
        for line, runs in lines.items():
            color = line_colors[line]
            for column, style, scale in columns:
                rounds, mean, std = series(runs, column, scale)
                if not rounds:
                    continue
                tag = line if len(columns) == 1 else f"{line} {column_name(column)}"
                marker = "o" if len(rounds) <= 25 else None  # a handful of evaluations: show the points
                ax.plot(rounds, mean, style, color=color, label=tag, linewidth=1.4, marker=marker, markersize=3)
                if len(runs) > 1:
                    ax.fill_between(rounds, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                                    color=color, alpha=0.15, linewidth=0)
        ax.set_title(panel or setting_title([r for runs in lines.values() for r in runs]) or out.name, fontsize=10)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def accuracy_by(runs: list[dict], columns: tuple[str, ...]) -> tuple[list[float], list[float]]:
    """(the sum of `columns`: cumulative bits, simulated time, test accuracy in %) at each evaluated round, each
    the mean over the runs, on the rounds every run evaluated (bits and times differ between seeds)."""
    per_round = defaultdict(list)
    for run in runs:
        for row in run["metrics"]:
            acc, r, bits = number(row.get("test_acc")), number(row.get("round")), [number(row.get(c)) for c in columns]
            if acc is not None and r is not None and None not in bits:
                per_round[int(r)].append((sum(bits), 100.0 * acc))
    rounds = [r for r in sorted(per_round) if len(per_round[r]) == len(runs)] or sorted(per_round)
    return ([sum(b for b, _ in per_round[r]) / len(per_round[r]) for r in rounds],
            [sum(a for _, a in per_round[r]) / len(per_round[r]) for r in rounds])


def plot_accuracy_by(groups: dict, out: Path, name: str = "accuracy_bits.png", xaxes: tuple = BITS,
                     log: bool = True, palette: dict[str, str] | None = None) -> Path | None:
    """One row of panels per group: accuracy against each of `xaxes` (metrics columns summed, and their label):
    bits uploaded and bits sent both ways (log scale), or simulated time and client updates. None when no run
    has those columns (runs from before metrics.csv counted bits; runs without a clock)."""
    curves = {(panel, line, i): accuracy_by(runs, columns) for panel, lines in groups.items()
              for line, runs in lines.items() for i, (columns, _) in enumerate(xaxes)}
    if not any(xs for xs, _ in curves.values()):
        return None
    line_colors = dict(palette or {})
    for lines in groups.values():
        for line in lines:
            line_colors.setdefault(line, f"C{len(line_colors) % 10}")
    fig, axes = plt.subplots(len(groups), 2, figsize=(10, 3.6 * len(groups)), squeeze=False)
    for row, (panel, lines) in zip(axes, groups.items()):
        for i, (ax, (_, xlabel)) in enumerate(zip(row, xaxes)):
            for line in lines:
                xs, ys = curves[(panel, line, i)]
                if xs:
                    ax.plot(xs, ys, "-", color=line_colors[line], label=line, linewidth=1.4,
                            marker="o" if len(xs) <= 25 else None, markersize=3)
            if log:
                log_axis(ax)  # methods that compress send orders of magnitude less
            title = panel or setting_title([r for runs in lines.values() for r in runs]) or out.name
            ax.set_title(title if log else f"{title}: {PER_STEP}", fontsize=10)
            ax.set_xlabel(f"{xlabel} (log scale)" if log else xlabel)
            ax.set_ylabel("test accuracy (%)")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curve_groups(groups: dict, column: str) -> dict:
    """`groups` (panel -> line -> runs) cut to the lines whose runs have `column` (full fine-tuning records no
    aggregation error of adapters), and the panels left with a line."""
    kept = {panel: {line: runs for line, runs in lines.items() if series(runs, column)[0]} for panel, lines in groups.items()}
    return {panel: lines for panel, lines in kept.items() if lines}


def column_name(column: str) -> str:
    return {"update_norm": "N", "client_update_norm": "E"}.get(column, column)


def plot_weights(runs: list[dict], out: Path, limit: int, axes: list[str] = ()) -> Path:
    """Per-client weight trajectories, one panel per run (a seed's clients and draws are its own: seeds are not
    averaged), at most `limit`: every cell's first seed, then every cell's second, ... so a cut leaves out seeds
    before it leaves out a cell, and says so."""
    cells = defaultdict(list)
    for run in sorted(runs, key=lambda r: (str(type(r["summary"].get("seed"))), r["summary"].get("seed"))):
        if run["weights"]:
            cells[describe(run, axes)].append(run)
    ranked = sorted((i, n, run) for n, seeds in enumerate(cells.values()) for i, run in enumerate(seeds))
    chosen = [run for _, _, run in ranked[:limit]] or runs[:1]
    if len(ranked) > limit:
        print(f"weights.png shows {limit} of {len(ranked)} runs (--max-weight-panels {len(ranked)} shows all)",
              file=sys.stderr)
    fig, panels = grid(len(chosen))  # not `axes`: that is the sweep axes describe() reads below
    for ax, run in zip(panels, chosen):
        by_client = defaultdict(list)
        for row in run["weights"]:
            w, r = number(row.get("weight")), number(row.get("round"))
            if w is not None and r is not None:
                by_client[row.get("client")].append((int(r), w))
        for client, points in sorted(by_client.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], linewidth=0.9, alpha=0.8, label=f"client {client}")
        panel, line = describe(run, axes)
        ax.set_title(" · ".join(t for t in (line, panel or setting_title([run], method=False),
                                            f"seed {run['summary'].get('seed')}") if t), fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel("aggregation weight")
        ax.grid(alpha=0.3)
        if 0 < len(by_client) <= 10:
            ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))  # beside: ten lines leave no free corner
    fig.tight_layout()
    path = out / "weights.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run folders or folders with runs below them")
    parser.add_argument("--out", type=Path, help="where the PNGs go (default: the folder given, or the runs' parent)")
    parser.add_argument("--max-weight-panels", type=int, default=12)
    parser.add_argument("--width", choices=("column", "page"), default="column",
                        help="a comparison's methods.pdf: one column of a two-column paper (3.3 in, panels stacked) or "
                             "the page (7 in, side by side)")
    parser.add_argument("--curve", action="append", default=[], metavar="COLUMN",
                        help="also draw this metrics.csv column per round into COLUMN.png (repeatable), e.g. agg_error")
    parser.add_argument("--wandb-mode", choices=("online", "offline", "disabled"),
                        help="override the runs' W&B mode for the plot run (disabled: no W&B)")
    args = parser.parse_args(argv)
    try:
        runs, unfinished = finished_runs(args.paths)
    except ResultsError as err:
        print(err, file=sys.stderr)
        return 2
    if unfinished:
        print(unfinished_note(unfinished), file=sys.stderr)
    if not runs:
        print(f"no finished runs (summary.json) under {', '.join(map(str, args.paths))}", file=sys.stderr)
        return 2
    run_dirs = [r["dir"] for r in runs]
    out = args.out or (args.paths[0] if len(args.paths) == 1 else Path(os.path.commonpath([str(d.parent) for d in run_dirs])))
    out.mkdir(parents=True, exist_ok=True)
    axes = sweep_axes(runs)
    groups: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        panel, line = describe(run, axes)
        groups[panel][line].append(run)
    colours = palette(runs, axes)
    curves = {column: curve_groups(groups, column) for column in args.curve}
    missing = [column for column, lines in curves.items() if not lines]
    if missing:
        print(f"--curve {missing[0]}: no run's metrics.csv has that column", file=sys.stderr)
        return 2
    images = [
        plot_curves(groups, out, "accuracy.png", [("test_acc", "-", 100.0)], "test accuracy (%)", colours),
        plot_curves(groups, out, "update_norms.png", [("update_norm", "-", 1.0), ("client_update_norm", "--", 1.0)],
                    "update norm (N solid, E dashed)", colours),
        plot_weights(runs, out, args.max_weight_panels, axes),
    ]
    images += [plot_curves(lines, out, f"{column}.png", [(column, "-", 1.0)], column, colours)
               for column, lines in curves.items()]
    by_bits = plot_accuracy_by(groups, out, palette=colours)
    by_time = plot_accuracy_by(groups, out, "accuracy_time.png", TIME, log=False, palette=colours)
    # runs from before metrics.csv counted bits have none to draw; runs without a clock have no time
    images += [path for path in (by_bits, by_time) if path is not None]
    if len(args.paths) == 1 and comparison.is_comparison(args.paths[0]):  # its figure: the tuned methods on one axis
        images += comparison_figure(args.paths[0], out, args.width)
    for path in images:
        print(path)
    wandb_log.log_to_wandb(runs, out, args.wandb_mode, "plots", lambda wandb: {p.stem: wandb.Image(str(p)) for p in images})
    return 0


if __name__ == "__main__":
    sys.exit(main())
