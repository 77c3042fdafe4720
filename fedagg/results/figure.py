"""A comparison's figure, the one a paper shows: every tuned method's mean test accuracy and seed band on one axis,
against rounds, and against bits uploaded (or simulated time) where the runs recorded them; written as
`methods.pdf` and `methods.png` in the comparison's folder. Also the run files' readers the plots share."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import EngFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402

from fedagg.results import comparison, integrity  # noqa: E402
from fedagg.results.derived import add_derived  # noqa: E402
from fedagg.results.values import number  # noqa: E402


def read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def load_run(run: dict) -> dict:
    """A run (runs.read_run's dict) with its curves and weights."""
    run_dir = run["_path"]
    return {"dir": run_dir, "summary": run, "metrics": read_csv(run_dir / "metrics.csv"),
            "weights": read_csv(run_dir / "weights.csv")}


def line_name(run: dict) -> str:
    """A method's line is labelled by its display name."""
    s = run["summary"]
    return str(s.get("method_name") or s.get("method") or "?")


def reweights(run: dict) -> bool:
    """Whether a run's aggregation weights are anything but each client's share of its round's samples (FedAvg's),
    the only weights worth a panel; a weights.csv without num_samples is drawn."""
    rounds: dict = defaultdict(list)
    for row in run["weights"]:
        w, n = number(row.get("weight")), number(row.get("num_samples"))
        if w is None or n is None:
            return True
        rounds[row.get("round")].append((w, n))
    return any(abs(w - n / total) > 1e-6 for pairs in rounds.values() if (total := sum(n for _, n in pairs)) > 0
               for w, n in pairs)


# what a comparison's figure puts accuracy against: rounds always; bits and simulated time where the runs recorded them
FIGURE_AXES = (("round", "round"), ("bits_up_total", "cumulative bits uploaded (log scale)"),
               ("sim_time", "simulated time (s), seeds averaged at each server step"))
# a paper's figure: TrueType fonts embedded (type 42; the default Type 3 is refused by IEEE's and ACM's checkers),
# text at the size of a caption once the figure is printed at its width
PAPER_STYLE = {"pdf.fonttype": 42, "ps.fonttype": 42, "font.size": 7, "axes.labelsize": 7, "axes.titlesize": 7,
               "xtick.labelsize": 6, "ytick.labelsize": 6, "legend.fontsize": 6, "legend.title_fontsize": 6}
WIDTHS = {"column": 3.3, "page": 7.0}  # inches: one column of a two-column paper, and the whole page


def curve_against(runs: list[dict], x: str) -> tuple[list[float], list[float], list[float]]:
    """(mean x, mean and std of the test accuracy in %) at each round every run evaluated."""
    per_round = defaultdict(list)
    for run in runs:
        for row in run["metrics"]:
            acc, r, at = number(row.get("test_acc")), number(row.get("round")), number(row.get(x))
            if acc is not None and r is not None and at is not None:
                per_round[int(r)].append((at, 100.0 * acc))
    rounds = [r for r in sorted(per_round) if len(per_round[r]) == len(runs)]
    xs = [sum(a for a, _ in per_round[r]) / len(runs) for r in rounds]
    means = [sum(v for _, v in per_round[r]) / len(runs) for r in rounds]
    stds = [math.sqrt(sum((v - m) ** 2 for _, v in per_round[r]) / max(len(runs) - 1, 1)) for r, m in zip(rounds, means)]
    return xs, means, stds


def colors(names) -> dict[str, str]:
    """One colour per method, by its place in the order given (the comparison's methods=): the same method has the
    same colour in every figure of a folder."""
    return {name: f"C{i % 10}" for i, name in enumerate(dict.fromkeys(names))}


def plot_methods(lines: dict[str, list[dict]], out: Path, stem: str = "methods", width: str = "column",
                 window: int | None = None, shown_as: str = "tuned") -> list[Path]:
    """A paper's figure: every method's mean test accuracy (band: ±sd over seeds) on one axis against rounds,
    and against bits uploaded when methods send different amounts, and simulated time when recorded; one column
    (panels stacked) or the page (side by side) wide. `window`: the table's last k evaluated rounds, shaded.
    Written as PDF (for LaTeX, TrueType fonts) and PNG."""
    if width not in WIDTHS:
        raise ValueError(f"width={width!r} is not allowed; it must be one of {', '.join(WIDTHS)}")
    curves = {x: {m: curve_against(runs, x) for m, runs in lines.items()} for x, _ in FIGURE_AXES}
    shown = [(x, words) for x, words in FIGURE_AXES if any(c[0] for c in curves[x].values())]
    if "bits_up_total" in dict(shown):  # only when the methods differ in what they send
        finals = {round(c[0][-1]) for c in curves["bits_up_total"].values() if c[0]}
        shown = [(x, w) for x, w in shown if x != "bits_up_total" or len(finals) > 1]
    n, inches = len(shown), WIDTHS[width]
    size = (inches, 2.2 * n) if width == "column" else (inches, 2.6)
    palette = colors(lines)
    with plt.rc_context(PAPER_STYLE):
        fig, axes = plt.subplots(n if width == "column" else 1, 1 if width == "column" else n, figsize=size,
                                 squeeze=False)
        for ax, (x, words) in zip(axes.flat, shown):
            for method, (xs, mean, std) in curves[x].items():
                color = palette[method]
                ax.plot(xs, mean, color=color, label=method, linewidth=1.2)
                ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                                color=color, alpha=0.18, linewidth=0)
            if x == "bits_up_total":
                log_axis(ax)
            elif x == "round":
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                _shade_window(ax, curves[x], window)
            ax.set_xlabel(words)
            ax.set_ylabel("test accuracy (%)")
            ax.grid(alpha=0.3)
        seeds = sorted({len(runs) for runs in lines.values()})
        first = axes.flat[0]
        first.legend(title=f"{shown_as}; mean ± sd over {'/'.join(map(str, seeds))} seeds")
        fig.tight_layout()
        paths = [out / f"{stem}.pdf", out / f"{stem}.png"]
        for path in paths:
            fig.savefig(path, dpi=200)
        plt.close(fig)
    return paths


def _shade_window(ax, curves: dict, window: int | None) -> None:
    """Shade the rounds the table averages (its last k evaluated rounds), labelled for the legend."""
    rounds = max((xs for xs, _, _ in curves.values()), key=len, default=[])
    if not window or not rounds:
        return
    first = rounds[-min(window, len(rounds))]
    step = (rounds[-1] - rounds[-2]) if len(rounds) > 1 else 1
    ax.axvspan(first - step / 2, rounds[-1] + step / 2, color="0.88", zorder=0, linewidth=0,
               label=f"table: last {window} evaluated round{'s' if window > 1 else ''}")


def log_axis(ax) -> None:
    """A log x axis (bits) whose labels neither overlap nor vanish: 1-2-5 steps within a few decades, decades
    beyond, in engineering units (2 Mb, 10 Mb), minor ticks unlabelled. Call it after plotting."""
    ax.set_xscale("log")
    low, high = ax.get_xlim()
    decades = math.log10(high / low) if low > 0 and high > low else 1.0
    subs = (1.0, 2.0, 5.0) if decades < 2.5 else (1.0,)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs, numticks=12 if decades < 2.5 else 7))
    ax.xaxis.set_major_formatter(EngFormatter(unit="b", places=0))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)


def comparison_figure(folder: Path, out: Path | None = None, width: str = "column") -> list[Path]:
    """methods.pdf and methods.png of a comparison folder (its tuned confirm runs, in the comparison's method
    order, the table's averaging window shaded); none when no tuned run finished."""
    lines = comparison_lines(folder)
    window = {run["summary"]["last_k"] for runs in lines.values() for run in runs if "last_k" in run["summary"]}
    return plot_methods(lines, out or folder, width=width, window=max(window, default=None)) if lines else []


def comparison_lines(folder: Path) -> dict[str, list[dict]]:
    """The figure's lines: each method's name -> its tuned confirm runs (sound ones, with curves), in the
    comparison's order."""
    order = comparison.methods(folder)
    runs = [load_run(r) for r in integrity.sound([r for r in comparison.confirm_runs(folder)
                                                  if r["_has_summary"] and r.get(comparison.TUNING) == "tuned"])]
    runs.sort(key=lambda r: order.index(r["summary"].get("method")) if r["summary"].get("method") in order else len(order))
    lines: dict[str, list] = defaultdict(list)
    for run in runs:
        if run["metrics"]:
            add_derived(run["summary"])  # its last_k: the window the table averages
            lines[line_name(run)].append(run)
    return dict(lines)
