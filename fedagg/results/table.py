"""Print a paper's table from a sweep's runs, next to the paper's numbers.

    python -m fedagg.results table outputs/tables/comparison_mnist/2025-01-01_12-00-00

Reads only the runs' `summary.json` files (any depth below the folder). A table
experiment (`conf/experiment/*.yaml`) stores its layout in every run's config under
`table`: which cell keys make the rows and the columns, where each key is found in
summary.json (`choices.aggregator`, `config.method`, `config.partition.alpha`, ...), the
metric, labels, and the CSV of the paper's numbers (`paper_results/<name>.csv`, one
line per cell with the same keys and a `paper` column). Runs of any other sweep work
with `--rows`/`--columns` (and `--key name=path` where a key is not a group choice).

Every cell shows the measured mean ± std over seeds (`--spread ci95`: ± the half-width of the mean's 95%
t interval), then the paper's value and the
difference: `89.73 ± 0.12 (91.20, -1.47)` (without published numbers, the measured value
alone). A cell whose runs all diverged is `×`, as in the papers; a cell without runs, or a
number the paper does not report, is `—`. The markdown goes to stdout and `table.md`; one
CSV line per cell goes to `table.csv`, both in the sweep folder.

`--baseline NAME` adds the paired statistics (fedagg/results/stats.py): for every cell the mean
difference to the row NAME over the seeds both have, with a 95% interval and `*` where it
excludes 0; each row's average rank over the columns, the Friedman test, and with at
least 3 rows and 3 columns a critical-difference diagram, `cd_diagram.png`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path

import pandas as pd

from fedagg.results import caption, checks, comparison, derived, integrity, render
from fedagg.results.groups import RECORDED_CHOICES
from fedagg.results.paper import load_paper, paper_cell, read_paper  # noqa: F401  (read_paper: used by tests)
from fedagg.results.runs import ResultsError, read_runs
from fedagg.results.paired import paired_section
from fedagg.results.values import CROSS, DASH, TO_TARGET, fmt, key_text, label, lookup, measure, number  # noqa: F401  (the table's API)



def table_spec(runs: list[dict], args) -> dict:
    specs = [lookup(r, "config.table") for r in runs if isinstance(lookup(r, "config.table"), dict)]
    spec = dict(specs[0]) if specs else {}
    names = {s.get("name") for s in specs}
    if len(names) > 1:
        print(f"warning: runs of several tables in one folder: {sorted(map(str, names))}", file=sys.stderr)
    if args.rows:
        spec["rows"] = args.rows
    if args.columns:
        spec["columns"] = args.columns
    spec.setdefault("rows", [METHOD])
    spec.setdefault("columns", ["dataset"])
    keys = dict(spec.get("keys") or {})
    for name in [*spec["rows"], *spec["columns"]]:
        keys.setdefault(name, name if name in RUN_KEYS else f"choices.{name}" if name in RECORDED_CHOICES else f"config.{name}")
    labels = dict(spec.get("labels") or {})
    labels["tuning"] = {"tuned": "Tuned", "defaults": "Defaults", **(labels.get("tuning") or {})}
    labels[METHOD] = {**{r.get(METHOD): r.get("method_name") for r in runs if r.get("method_name")},
                      **(labels.get(METHOD) or {})}  # the table's own labels first, then the methods' YAML names
    spec["labels"] = labels
    for item in args.key or []:
        name, _, path = item.partition("=")
        keys[name] = path
    spec["keys"] = keys
    metric = args.metric or spec.get("metric", DEFAULT_METRIC)
    own = spec.get("metric")
    spec["metric"] = METRIC_NAMES.get(metric, metric)
    if own and spec["metric"] != own and not (spec.get("percent") and checks.is_accuracy(spec["metric"])):
        spec.pop("percent", None)  # the table's format was for its own metric
        spec.pop("decimals", None)
    percent, decimals = checks.number_format(runs, spec["metric"])
    spec.setdefault("percent", percent)
    spec.setdefault("decimals", decimals)
    if args.paper:
        spec["paper"] = args.paper
    spec["spread"] = getattr(args, "spread", None) or spec.get("spread") or "sd"
    if spec["spread"] not in SPREADS:
        raise ResultsError(f"table.spread={spec['spread']!r} is not allowed; it must be one of {', '.join(SPREADS)} "
                           "(± the standard deviation over seeds, or the half-width of the mean's 95% t interval)")
    return spec


def table_spec_metric(runs: list[dict]) -> str | None:
    """The metric of the table the runs belong to (table_spec's: the first run's config.table), if it names one."""
    specs = [lookup(r, "config.table") for r in runs if isinstance(lookup(r, "config.table"), dict)]
    return specs[0].get("metric") if specs else None


METHOD = "method"  # summary.json's method id (fedagg.results.groups.method_of): the rows unless a table says otherwise
SPREADS = ("sd", "ci95")  # what follows a cell's mean: ± the seeds' standard deviation, or its 95% t interval
RUN_KEYS = (METHOD, "tuning")  # cell keys read from the run itself, not from its choices or config
DEFAULT_METRIC = derived.LAST_K  # the comparison's test metric too: one definition unless --metric or the table names another
METRIC_NAMES = {"final": "final_test_acc", "best": "best_test_acc", "last_k": derived.LAST_K,  # --metric final|...
                "jain": derived.JAIN, "gap10": derived.GAP}


def ordered(keys_seen: list[tuple], paper_keys: list[tuple], names: list[str] = (), order: dict | None = None) -> list[tuple]:
    """The paper's cells in its order, then the others: by `order` (key -> its values in order: the comparison's
    methods, tuned before defaults) where given, else sorted."""
    first, order = list(dict.fromkeys(paper_keys)), order or {}

    def place(key: tuple) -> tuple:
        return tuple((order.get(n, []).index(v) if v in order.get(n, []) else len(order.get(n, [])), v)
                     for n, v in zip(names, key))

    return first + sorted((k for k in dict.fromkeys(keys_seen) if k not in first), key=place)


def build(runs: list[dict], spec: dict, measured_only: bool = False) -> tuple[render.Block, list[dict], set, dict]:
    rows_k, cols_k, keys = spec["rows"], spec["columns"], spec["keys"]
    cells: dict[tuple, list[dict]] = {}
    for run in runs:
        cell = tuple(key_text(lookup(run, keys[k])) for k in [*rows_k, *cols_k])
        cells.setdefault(cell, []).append(run)
    checks.check_cells(cells, spec, lambda cell: " ".join(label(spec, k, v) for k, v in zip([*rows_k, *cols_k], cell)))
    paper = {tuple(key_text(p.get(k)) for k in [*rows_k, *cols_k]): p for p in load_paper(spec)}
    spec["has_paper"] = bool(paper)
    split = lambda cell: (cell[: len(rows_k)], cell[len(rows_k):])  # noqa: E731
    rows = ordered([split(c)[0] for c in cells], [split(c)[0] for c in paper], rows_k, spec.get("order"))
    cols = ordered([split(c)[1] for c in cells], [split(c)[1] for c in paper], cols_k, spec.get("order"))
    if measured_only:  # a partly run table: only the rows and columns that have runs
        rows = [r for r in rows if any(r + c in cells for c in cols)]
        cols = [c for c in cols if any(r + c in cells for r in rows)]
    records, grid = [], {}
    for r in rows:
        for c in cols:
            m = measure(cells.get(r + c, []), spec)
            p_value, p_text = paper_cell(paper.get(r + c), spec)
            diff = m["mean"] - p_value if m["mean"] is not None and p_value is not None else None
            inner = p_text + (f", {diff:+.{spec['decimals']}f}" if diff is not None else "")
            grid[r + c] = f"{m['text']} ({inner})" if paper else m["text"]
            records.append({**dict(zip([*rows_k, *cols_k], r + c)), **{k: m[k] for k in m if k != "text"},
                            "paper": p_value, "paper_text": p_text, "diff": diff, "measured_text": m["text"]})
    extra = {split(c)[0] for c, rs in cells.items() if any(x.get("uses_extra_data") for x in rs)}
    average = bool(spec.get("average_column"))
    header = [spec.get("row_header") or " / ".join(rows_k)] + [" ".join(label(spec, k, v) for k, v in zip(cols_k, c)) for c in cols]
    body = []
    for r in rows:
        name = " ".join(label(spec, k, v) for k, v in zip(rows_k, r)) + (" †" if r in extra else "")
        row_cells = [grid[r + c] for c in cols]
        if average:
            row_cells.append(average_cell([x for x in records if tuple(x[k] for k in rows_k) == r], spec))
        body.append([name, *row_cells])
    grid_block = render.grid(header + (["Average"] if average else []), body)
    return grid_block, records, extra, {"cells": cells, "rows": rows, "cols": cols}


def average_cell(records: list[dict], spec: dict) -> str:
    d = spec["decimals"]
    means, papers = [x["mean"] for x in records], [x["paper"] for x in records]
    m = statistics.fmean(means) if means and None not in means else None
    p = statistics.fmean(papers) if papers and None not in papers else None
    inner = (fmt(p, d) if p is not None else DASH) + (f", {m - p:+.{d}f}" if m is not None and p is not None else "")
    return f"{fmt(m, d) if m is not None else DASH} ({inner})"


def notes(runs: list[dict], spec: dict, extra: set, unfinished: list[dict] = ()) -> list[str]:
    out = []
    scales = sorted({float(r.get("experiment_scale", 1.0) or 1.0) for r in runs})
    if any(s < 1 for s in scales):
        shown = ", ".join(key_text(s) for s in scales)
        out.append(f"**Scaled runs (experiment_scale = {shown})**: rounds, every client's data and the test set "
                   "were shrunk for a quick check; these numbers are not comparable to the paper's.")
    seeds = sorted({str(r.get("seed")) for r in runs}, key=lambda x: (not x.isdigit(), int(x) if x.isdigit() else 0, x))
    what = spec["metric"] + (" (%)" if spec["percent"] else "")
    against = ", then (paper value, measured − paper)" if spec.get("has_paper") else ""
    spread = "± the half-width of the mean's 95% t interval" if spec.get("spread") == "ci95" else "± std"
    out.append(f"Each cell: measured {what}, mean {spread} over seeds ({', '.join(seeds)}){against}. "
               f"{CROSS}: every run diverged; {DASH}: not run or not reported.")
    profiles = Counter(str(((r.get("config") or {}).get("table") or {}).get("profile")) for r in runs)
    profiles.pop("None", None)
    if len(profiles) == 1:
        out.append(f"Settings profile: {next(iter(profiles))} (`table.profile`; the experiment file names each setting's source).")
    elif profiles:
        listed = ", ".join(f"{name} ({n} runs)" for name, n in sorted(profiles.items()))
        out.append(f"**Runs of several settings profiles are pooled here**: {listed}; table one profile at a time.")
    if spec.get("paper_metric"):
        paper_key = spec["paper_metric"].split()[0]
        same = "" if paper_key == spec["metric"] else (f" **This table shows {spec['metric']} instead**: "
                                                      f"`--metric {paper_key}` compares like with like.")
        out.append(f"The paper's numbers are {spec['paper_metric']}.{same}")
    if spec["metric"] in TO_TARGET:
        targets = sorted({key_text(r.get("target_acc")) for r in runs})
        what = "Rounds" if spec["metric"] == "rounds_to_target" else "Simulated seconds (the clock's sim_time)"
        out.append(f"{what} to reach the target accuracy ({', '.join(targets)}); N/A (x%): never reached, best accuracy x.")
    if extra:
        out.append("† uses extra data on the server (uses_extra_data): reported for reference only, as in the paper.")
    other = [r for r in runs if r.get("status") not in ("completed", "diverged")] + list(unfinished)
    if other:
        listed = ", ".join(f"{r['_dir']} ({r.get('status')})" for r in other[:10])
        out.append(f"{len(other)} run(s) left out (not completed): {listed}{' …' if len(other) > 10 else ''}")
    return out


def build_table(folder: Path, *, rows: list[str] | None = None, columns: list[str] | None = None,
                metric: str | None = None, paper: str | None = None, keys: dict[str, str] | None = None,
                measured_only: bool = False, baseline: str | None = None, runs: list[dict] | None = None,
                last_k: int | None = None, order: list[str] | None = None, spread: str | None = None) -> render.Table:
    """The table of the runs below `folder` (the table experiment's layout unless rows, columns, metric or paper
    are given; keys: where a cell key is found in summary.json), with the paired statistics against the row
    `baseline` when given (the CD diagram is written into folder); metric last_k averages the last `last_k` evaluated
    rounds (default ⌈R/10⌉); order: the methods' row order (a comparison's methods=, read from its folder unless
    given); spread: sd or ci95, what follows each mean (default: the table's, else sd). ResultsError: one line
    saying why not."""
    folder = Path(folder)
    compared = runs is None and comparison.is_comparison(folder)  # its confirm runs, tuned and defaults side by side
    found = comparison.confirm_runs(folder) if compared else read_runs(folder) if runs is None else runs
    runs = integrity.sound([run for run in found if run.get("_has_summary", True)])
    unfinished = [run for run in found if not run.get("_has_summary", True)]  # running, or killed
    if not runs:
        raise ResultsError(f"no summary.json below {folder}" + (" confirm/" if compared else ""))
    if compared:
        columns = columns or [*comparison.setting_columns(runs), comparison.TUNING]
        baseline = baseline or comparison.baseline(folder)
    args = argparse.Namespace(rows=rows, columns=columns, metric=metric, paper=paper,
                              key=[f"{k}={v}" for k, v in (keys or {}).items()], spread=spread)
    if last_k is not None and (isinstance(last_k, bool) or not isinstance(last_k, int) or last_k < 1):
        raise ResultsError(f"--last-k {last_k} is not allowed; it must be an integer >= 1 (evaluated rounds averaged)")
    shown = metric or table_spec_metric(runs) or DEFAULT_METRIC  # --metric, else the table's own (table.metric)
    if METRIC_NAMES.get(shown, shown) in derived.DERIVED:  # computed from the runs' CSV files
        runs = [derived.add_derived(run, last_k) for run in runs]
    spec = table_spec(runs, args)
    spec["order"] = {comparison.TUNING: ["tuned", "defaults"], **(spec.get("order") or {})}
    methods = order or (comparison.methods(folder) if compared else [])
    if methods or baseline:
        spec["order"].setdefault(METHOD, methods or [baseline])  # the comparison's order; else the baseline first
    if spec["rows"] == [METHOD]:
        spec.setdefault("row_header", "Method")
    checks.check_keys(runs, spec, {**{n: "--rows" for n in rows or []}, **{n: "--columns" for n in columns or []},
                                   **{n: "--key" for n in keys or {}}})
    checks.check_metric(runs, spec, metric)
    protocols = [comparison.read_protocol(p)["protocol"] for p in comparison.protocol_files(folder)] if compared else []
    spec.update(caption.words(runs, spec, protocols[0] if len(protocols) == 1 else None))
    grid_block, records, extra, layout = build(runs, spec, measured_only=measured_only)
    paired = []
    if baseline:
        paired, per_cell = paired_section(layout, spec, baseline, folder)
        for record in records:
            diff = per_cell.get(tuple(record[k] for k in [*spec["rows"], *spec["columns"]]))
            record.update(diff_to_baseline=diff and diff.mean, ci_low=diff and diff.low, ci_high=diff and diff.high,
                          n_pairs=diff and diff.n, interval=diff and diff.interval,
                          excludes_zero=diff and diff.excludes_zero)
    if compared and not spec.get("caption"):
        setting = comparison.setting_text(folder)
        spec["caption"] = "Fair comparison, tuned and at defaults" + (f" ({setting})" if setting else "")
        spec["latex_lead"] = "Fair comparison, tuned and at defaults"  # the caption's words say the setting
    spec.setdefault("name", folder.resolve().name)
    title = render.heading(f"{spec['name']}: {spec.get('caption', spec['metric'])}", 3)
    source = [render.text(f"Paper: {spec['source']}")] if spec.get("source") else []
    shown = ["Only the rows and columns with runs are shown (--measured-only)."] if measured_only else []
    stated = [derived.convention(spec["metric"], runs)]
    if spec["metric"] in ("final_test_acc", "best_test_acc", derived.LAST_K) and any(
            "final_client_acc_mean" in run for run in runs):
        stated.append("These runs also scored every client on its own test split: `--metric final_client_acc_mean` "
                      "shows the mean of the per-client accuracies, next to this pooled test-set accuracy.")
    blocks = [title, *map(render.text, stated), *source, grid_block, *map(render.text, notes(runs, spec, extra, unfinished) + shown), *paired]
    return render.Table(blocks, cell_frame(records), spec, layout)


def cell_frame(records: list[dict]) -> pd.DataFrame:
    """The cells as a DataFrame: a column of floats (None where absent) as float64, every other column as the
    values were (a count that may be absent stays an int, not 3.0)."""
    frame = pd.DataFrame(records, dtype=object)
    for column in frame:
        values = [v for v in frame[column] if v is not None]
        if values and all(isinstance(v, float) for v in values):
            frame[column] = frame[column].astype(float)
    return frame


STATS_PURPOSE = ("Only the paired statistics of a sweep against --baseline (no table; table.md and table.csv are left "
                 "as they are): each row's "
                 "mean difference to the baseline over the seeds both have with its 95% interval, the average ranks, "
                 "the Friedman test, and with at least 3 rows and 3 columns the critical-difference diagram.")


def main(argv: list[str] | None = None, prog: str | None = None, stats_only: bool = False) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=STATS_PURPOSE if stats_only else __doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a sweep folder (runs with summary.json below it)")
    parser.add_argument("--metric", help="final, best (selected on the test set), last_k (mean of the last k evaluated "
                        "rounds), jain, gap10 (fairness over clients) or any summary.json key (default: the table's, "
                        f"else {DEFAULT_METRIC}: the mean test accuracy of the last k = ⌈R/10⌉ evaluated rounds)")
    parser.add_argument("--paper", help="CSV of the paper's numbers (default: the table's)")
    parser.add_argument("--rows", nargs="+", help="cell keys of the rows (default: the table's)")
    parser.add_argument("--columns", nargs="+", help="cell keys of the columns (default: the table's)")
    parser.add_argument("--key", action="append", help="NAME=PATH: where a cell key is in summary.json")
    parser.add_argument("--measured-only", action="store_true",
                        help="show only the rows and columns that have runs (a partly run table)")
    parser.add_argument("--last-k", type=int, help="with --metric last_k: how many evaluated rounds (default ⌈R/10⌉)")
    parser.add_argument("--spread", choices=SPREADS, help="after each mean: ± the standard deviation over the seeds "
                        "(sd) or the half-width of the mean's 95%% t interval (ci95) (default: the table's, else sd)")
    parser.add_argument("--baseline", required=stats_only,
                        help="a row (e.g. fedavg): paired differences to it, ranks, Friedman, CD diagram")
    parser.add_argument("--format", choices=("markdown", "csv", "latex", "html"), default="markdown",
                        help="what is printed (table.md and table.csv are written in any case)")
    parser.add_argument("--width", choices=("column", "page"), default="column",
                        help="with --format latex: fit one column of the paper (table, \\columnwidth) or span the page "
                             "(table*, \\textwidth); shrunk only when wider (default: column)")
    args = parser.parse_args(argv)
    keys = dict(item.partition("=")[::2] for item in args.key or [])
    try:
        table = build_table(args.folder, rows=args.rows, columns=args.columns, metric=args.metric, paper=args.paper,
                            keys=keys, measured_only=args.measured_only, baseline=args.baseline,
                            last_k=args.last_k, spread=args.spread)
    except ResultsError as err:
        print(err, file=sys.stderr)
        return 2
    shown = table
    if stats_only:  # the paired statistics: from their first section heading on
        shown = render.Table(table.blocks[next(i for i, b in enumerate(table.blocks) if b.level == 4):], table.cells)
    print({"markdown": shown.to_markdown, "csv": shown.to_csv, "latex": lambda: shown.to_latex(args.width),
           "html": shown.to_html}[args.format](), end="")
    if not stats_only:
        (args.folder / "table.md").write_text(table.to_markdown())
        (args.folder / "table.csv").write_text(table.to_csv())
    return 0


if __name__ == "__main__":
    sys.exit(main())
