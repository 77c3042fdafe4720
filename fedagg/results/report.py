"""One self-contained HTML report of a sweep: what ran, the table, curves, clients, weights, statistics.

    python -m fedagg.results report outputs/multirun/2025-01-01/12-00-00 [--baseline fedavg]

Reads the runs' files below the folder (summary.json, metrics.csv, weights.csv,
clients.csv, partition.png) and writes `report.html` beside them (`results_report.html` in a comparison's
folder, whose report.html is the comparison's own), every image embedded,
so it opens in a browser with no server and no network: the settings that vary across the
runs and those they share; the table (next to the paper's numbers when the runs belong to
a table experiment); test accuracy per round with a band over seeds; test accuracy
against the bits sent (runs that count them); each method's per-client accuracies at the
last evaluation (runs with eval.per_client=true); the aggregation weights over rounds; the
partition; and the paired statistics of make_table --baseline (default: fedavg when it is
a row). When the runs logged to W&B (logger=wandb in their config), a new run of their
project and group (job type `report`) gets the table as a wandb.Table and the page, and an
artifact of type `report` holding report.html, the table and table.csv; `--wandb-mode`
overrides the runs' mode (disabled: nothing goes to W&B).
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedagg.results import comparison, plots as plot, render, stats, table as make_table, wandb_log  # noqa: E402
from fedagg.results.paired import seed_values  # noqa: E402
from fedagg.results.groups import RECORDED_CHOICES  # noqa: E402
from fedagg.results.runs import ResultsError, flatten, natural, sweep_frame  # noqa: E402

STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px}
th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee}section{margin:2.5em 0}
code{background:#f6f6f6;padding:1px 4px}.muted{color:#666;font-size:13px}"""


def shared_settings(flat: list[dict]) -> dict[str, str]:
    """The flattened settings every run has, with the same value (as JSON). A key that some runs lack is not one
    of them, whatever the others hold (FedAWA's `server_lr: null` beside FedAvg, which has no such key)."""
    keys = set(flat[0]).intersection(*flat[1:]) if flat else set()
    return {k: json.dumps(flat[0][k], default=str) for k in sorted(keys)
            if len({json.dumps(f[k], default=str) for f in flat}) == 1}


def what_was_run(runs: list[dict], unfinished: list[dict], table, folder: Path) -> str:
    """The sweep's axes (the group choices, overrides and seeds that vary), each method with its settings, the
    settings every run shares, and the runs left out."""
    frame = sweep_frame([run["summary"] for run in runs])
    method_keys = ("aggregator", "client/objective")  # what `method` names: one axis, not three
    axes = ["seed", "method", *(g for g in RECORDED_CHOICES if g in frame and g not in method_keys),
            *(k for k in frame.attrs["varying"] if k not in method_keys)]
    varying = {c: sorted({make_table.key_text(value_of(run["summary"], c, v)) for run, v in zip(runs, frame[c])},
                         key=natural) for c in dict.fromkeys(axes)}
    rows = "".join(f"<tr><td><code>{html.escape(k)}</code></td><td>{html.escape(', '.join(v))}</td></tr>"
                   for k, v in varying.items() if len(v) > 1)
    flat = [flatten({"choices": r["summary"].get("choices") or {}, "config": r["summary"].get("config") or {}})
            for r in runs]
    fixed = shared_settings(flat)
    shared = "".join(f"<tr><td><code>{html.escape(k)}</code></td><td>{html.escape(v)}</td></tr>" for k, v in fixed.items())
    left = f"<p>{html.escape(plot.unfinished_note(unfinished))}: not in this report.</p>" if unfinished else ""
    return (f"<p>{len(runs)} runs in <code>{html.escape(str(folder))}</code>.</p>{left}"
            f"<table><tr><th>varies</th><th>values</th></tr>{rows}</table>{methods(table)}"
            f"<details><summary>settings every run shares ({len(fixed)})</summary><table>{shared}</table></details>")


def value_of(summary: dict, key: str, value):
    """A sweep axis's value for one run: a run that did not override the key ran at its configured value (a
    comparison's defaults), which the config holds, never NaN."""
    if value is None or (isinstance(value, float) and value != value):
        found = make_table.lookup(summary, f"config.{key}")
        return found if found is not None else "(not set)"
    return value


def methods(table) -> str:
    """Each row of the table with its aggregator and that aggregator's settings (over the row's runs)."""
    spec, layout = table.spec, table.layout
    lines = []
    for row in layout["rows"]:
        runs = [run for cell, rs in layout["cells"].items() if cell[: len(row)] == row for run in rs]
        settings = [{**flatten((run.get("config") or {}).get("aggregator") or {}),
                     **(flatten(make_table.lookup(run, "config.client.objective") or {}, "objective.")
                        if (run.get("choices") or {}).get("client/objective") not in (None, "none") else {})}
                    for run in runs]  # a client objective's settings are the method's too (FedProx's mu)
        if not settings:
            continue
        target = {str(s.get("_target_", "")).rsplit(".", 1)[-1] + (f", objective {str(o).rsplit('.', 1)[-1]}"
                                                                  if (o := s.get("objective._target_")) else "")
                  for s in settings}
        parts = []
        for key in dict.fromkeys(k for s in settings for k in s if k.rsplit(".", 1)[-1] not in ("_target_", "display_name")):
            values = sorted({json.dumps(s.get(key), default=str) for s in settings})
            parts.append(f"{key}={values[0]}" if len(values) == 1 else f"{key} varies ({', '.join(values)})")
        name = " ".join(make_table.label(spec, k, v) for k, v in zip(spec["rows"], row))
        lines.append(f"<tr><td>{html.escape(name)}</td><td><code>{html.escape(', '.join(sorted(target)))}</code></td>"
                     f"<td>{html.escape('; '.join(parts) or '(none)')}</td></tr>")
    head = html.escape(spec.get("row_header") or "row")
    return f"<table><tr><th>{head}</th><th>aggregator</th><th>its settings</th></tr>{''.join(lines)}</table>"


def image(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def client_distributions(groups: dict, path: Path, palette: dict[str, str] | None = None) -> Path | None:
    """Box plots of every client's accuracy at each run's last evaluation, one box per method (seeds pooled)."""
    boxes = {}
    for lines in groups.values():
        for line, runs in lines.items():
            accs = []
            for run in runs:
                rows = plot.read_csv(run["dir"] / "clients.csv")
                if rows:
                    last = max(int(r["round"]) for r in rows)
                    accs += [100 * float(r["test_acc"]) for r in rows if int(r["round"]) == last]
            if accs:
                boxes[line] = accs
    if not boxes:
        return None
    fig, ax = plt.subplots(figsize=(1.6 + 1.2 * len(boxes), 3.6))
    parts = ax.boxplot(list(boxes.values()), showmeans=True, patch_artist=True)
    for box, line in zip(parts["boxes"], boxes):  # each method in its colour of the other figures
        box.set(facecolor=(palette or {}).get(line, "white"), alpha=0.5)
    ax.set_xticks(range(1, len(boxes) + 1), list(boxes), rotation=20)
    ax.set_ylabel("client test accuracy (%)")
    ax.set_title("per-client accuracy at the last evaluation (all seeds)", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def differences_figure(layout: dict, spec: dict, baseline: tuple, path: Path) -> Path:
    """Each row's paired difference to the baseline with its 95% interval, per column."""
    names = [r for r in layout["rows"] if r != baseline]
    fig, ax = plt.subplots(figsize=(6.5, 1.2 + 0.45 * len(names) * max(len(layout["cols"]), 1)))
    y, ticks = 0, []
    for r in names:
        for c in layout["cols"]:
            diff = stats.paired_difference(seed_values(layout["cells"].get(r + c, []), spec),
                                           seed_values(layout["cells"].get(baseline + c, []), spec))
            if diff.mean is not None:
                err = [[diff.mean - diff.low], [diff.high - diff.mean]] if diff.low is not None else None
                ax.errorbar(diff.mean, y, xerr=err, fmt="o", color="C3" if diff.excludes_zero else "C0", capsize=3)
            ticks.append(" · ".join(make_table.label(spec, k, v) for k, v in zip([*spec["rows"], *spec["columns"]], r + c)))
            y += 1
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(ticks)), ticks, fontsize=8)
    ax.invert_yaxis()
    shown = " ".join(make_table.label(spec, k, v) for k, v in zip(spec["rows"], baseline))
    ax.set_xlabel(f"difference to {shown} (95% interval; red: excludes 0)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def build_report(folder: Path, baseline: str | None, work: Path, rows: list[str] | None = None,
                 columns: list[str] | None = None) -> tuple[str, list[dict]]:
    runs, unfinished = plot.finished_runs([folder])
    if not runs:
        raise ResultsError(f"no finished runs (summary.json) under {folder}")
    summaries = [run["summary"] for run in runs]
    axes = plot.sweep_axes(runs)
    if columns is None and axes:  # a plain sweep over more than methods: a column per setting, nothing pooled
        columns = list(dict.fromkeys(["dataset", *axes]))
    order = comparison.methods(folder)  # a comparison's rows in its methods= order, whichever is the baseline
    layout = make_table.build_table(folder, runs=summaries + unfinished, rows=rows, columns=columns, order=order).layout
    names = {r: " ".join(r) for r in layout["rows"]}
    if baseline is None:
        baseline = comparison.baseline(folder) or ("fedavg" if "fedavg" in names.values() else None)
    paired_on = baseline if baseline and len(layout["rows"]) > 1 else None
    table = make_table.build_table(work, runs=summaries + unfinished, baseline=paired_on, rows=rows, columns=columns,
                                   order=order)  # the CD diagram goes to work
    spec = table.spec
    groups: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        panel, line = plot.describe(run, axes)
        groups[panel][line].append(run)
    sections = []
    sections.append(("What was run", what_was_run(runs, unfinished, table, folder)))
    at = next(i for i, b in enumerate(table.blocks) if b.kind == "heading" and b.level == 4) if paired_on else None
    sections.append(("Table", render.Table(table.blocks[1:at]).to_html()))  # the page's headings name it
    colours = plot.palette(runs, axes)  # one colour per method, in the comparison's order, in every figure
    accuracy = plot.plot_curves(groups, work, "accuracy.png", [("test_acc", "-", 100.0)], "test accuracy (%)", colours)
    sections.append(("Test accuracy per round", image(accuracy, "test accuracy per round") +
                     '<p class="muted">Mean over seeds; the band is ± one standard deviation.</p>'))
    by_bits = plot.plot_accuracy_by(groups, work, palette=colours)
    if by_bits:
        sections.append(("Test accuracy against bits sent", image(by_bits, "test accuracy against bits sent") +
                         '<p class="muted">Mean over seeds at each evaluated round; bits counted as the README\'s '
                         '"Communication" says (32-bit models unless a method compresses).</p>'))
    by_time = plot.plot_accuracy_by(groups, work, "accuracy_time.png", plot.TIME, log=False, palette=colours)
    if by_time:  # runs on a simulated clock
        sections.append(("Test accuracy against simulated time", image(by_time, "test accuracy against simulated time") +
                         '<p class="muted">Each point: the mean over seeds at one evaluated server step (round) of the '
                         'simulated time and of the test accuracy; simulated seconds and client updates as the README\'s '
                         '"A simulated clock" says.</p>'))
    clients = client_distributions(groups, work / "clients.png", colours)
    if clients:
        sections.append(("Per-client accuracy", image(clients, "per-client accuracy")))
    drawn = [run for run in runs if run["weights"] and plot.reweights(run)]
    same = sorted({plot.describe(run, axes)[1] for run in runs if run["weights"] and run not in drawn})
    note = (f'<p class="muted">{html.escape(", ".join(same))}: each client weighted by its share of the round\'s '
            'samples (FedAvg\'s weights), not drawn.</p>') if same else ""
    if drawn:
        sections.append(("Aggregation weights", image(plot.plot_weights(drawn, work, 12, axes), "aggregation weights") + note))
    elif note:
        sections.append(("Aggregation weights", note))
    shown = next((r for r in runs if (r["dir"] / "partition.png").exists()), None)
    if shown:
        caption = (f"The partition of seed {shown['summary'].get('seed')} (run {shown['summary']['_dir']}); every run "
                   "with the same seed and partition settings has the same split.")
        sections.append(("Partition", image(shown["dir"] / "partition.png", "partition") +
                         f'<p class="muted">{html.escape(caption)}</p>'))
    if paired_on:
        shown = {r: " ".join(make_table.label(spec, k, v) for k, v in zip(spec["rows"], r)) for r in layout["rows"]}
        base = next(r for r in layout["rows"] if baseline in (" ".join(r), names[r], shown[r]))  # the id or the name
        body = image(differences_figure(layout, spec, base, work / "differences.png"), "paired differences")
        body += render.Table(table.blocks[at:]).to_html()
        if (work / "cd_diagram.png").exists():
            body += image(work / "cd_diagram.png", "critical difference diagram")
        sections.append((f"Paired statistics against {baseline}", body))
    title = spec.get("name") or folder.name
    parts = [f"<section><h2>{html.escape(h)}</h2>{b}</section>" for h, b in sections]
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>fedagg report: {html.escape(title)}</h1>{''.join(parts)}</body></html>")
    return page, runs, table


def wandb_items(page: str, table):
    """What the report run logs: the table's cells as a wandb.Table and the page, shown in the run."""
    return lambda wandb: {"table": wandb.Table(dataframe=wandb_frame(table.cells)), "report": wandb.Html(page)}


def wandb_artifact(report: Path, table):
    """The report page and the table (as a W&B table and as table.csv) in one artifact of type `report`."""
    def make(wandb):
        name = "report-" + "".join(c if c.isalnum() or c in "-_." else "-" for c in report.parent.resolve().name)
        artifact = wandb.Artifact(name, type="report", description=f"fedagg report of {report.parent.resolve()}")
        artifact.add_file(str(report), name="report.html")
        artifact.add(wandb.Table(dataframe=wandb_frame(table.cells)), "table")
        with artifact.new_file("table.csv") as f:
            f.write(table.to_csv())
        return artifact
    return make


def wandb_frame(cells):
    """The cells as W&B types them: a column of numbers, of text or of booleans, None where absent (not NaN); any
    other column (mixed or tuple values) as text."""
    frame = cells.astype(object).where(cells.notna(), None)
    for column in frame:
        values = [v for v in frame[column] if v is not None]
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if not (numbers or all(isinstance(v, str) for v in values) or all(isinstance(v, bool) for v in values)):
            frame[column] = [None if v is None else str(v) for v in frame[column]]
    return frame


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a sweep folder (runs below it)")
    parser.add_argument("--baseline", help="the row the paired statistics compare with (default: fedavg if present)")
    parser.add_argument("--rows", nargs="+", help="cell keys of the table's rows (default: the table's, else aggregator)")
    parser.add_argument("--columns", nargs="+",
                        help="cell keys of its columns (default: the table's, else dataset and every other setting the "
                             "sweep varies)")
    parser.add_argument("--wandb-mode", choices=("online", "offline", "disabled"),
                        help="override the runs' W&B mode for the report run (disabled: no W&B)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / args.folder.resolve().name  # plot titles a panel without a name after its folder
        work.mkdir()
        try:
            page, runs, table = build_report(args.folder, args.baseline, work, args.rows, args.columns)
        except ValueError as err:
            print(err, file=sys.stderr)
            return 2
    out = args.folder / ("results_report.html" if comparison.is_comparison(args.folder) else "report.html")
    out.write_text(page)
    print(out)
    if out.name != "report.html":
        print("(its report.html is the comparison's own, with its tuning: left as it is)", file=sys.stderr)
    wandb_log.log_to_wandb(runs, args.folder, args.wandb_mode, "report", wandb_items(page, table), wandb_artifact(out, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
