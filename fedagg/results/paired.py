"""table --baseline: the paired statistics of a table (fedagg/results/stats.py) as blocks of the Table.

For every cell, the mean difference to the baseline row over the seeds both have with its
95% interval; each row's average rank over the columns, the Friedman test, and the
critical-difference diagram.
"""

from __future__ import annotations

from pathlib import Path

from fedagg.results import render, stats
from fedagg.results.runs import ResultsError
from fedagg.results.comparison import TUNING
from fedagg.results.values import DASH, TO_TARGET, label, measure, number


def seed_values(runs: list[dict], spec: dict) -> dict:
    """The metric (scaled as shown) of every completed run of one cell, by seed."""
    scale = 100.0 if spec["percent"] else 1.0
    out = {}
    for run in runs:
        value = number(run.get(spec["metric"]))
        if run.get("status") == "completed" and value is not None:
            out[run.get("seed")] = value * scale
    return out


def paired_section(layout: dict, spec: dict, baseline: str, folder: Path) -> tuple[list[render.Block], dict]:
    """Blocks of the paired differences to `baseline`, the average ranks, Friedman and the CD diagram;
    and each cell's paired statistics for table.csv."""
    rows_k, rows, cols, cells = spec["rows"], layout["rows"], layout["cols"], layout["cells"]
    name = {r: " ".join(label(spec, k, v) for k, v in zip(rows_k, r)) for r in rows}
    base = [r for r in rows if baseline in (" ".join(r), name[r])]
    if not base:
        raise ResultsError(f"--baseline {baseline!r} is not a row of this table; the rows are: "
                         + ", ".join(name[r] for r in rows))
    base, d = base[0], spec["decimals"]
    spec["baseline_row"], spec["baseline_name"] = base, name[base]  # for the LaTeX table's Δ column and caption
    header = ([spec.get("row_header") or " / ".join(rows_k)]
              + [" ".join(label(spec, k, v) for k, v in zip(spec["columns"], c)) for c in cols])
    body = []
    per_cell, used = {}, set()
    for r in rows:
        texts = []
        for c in cols:
            if r == base:
                texts.append("baseline")
                continue
            diff = stats.paired_difference(seed_values(cells.get(r + c, []), spec), seed_values(cells.get(base + c, []), spec))
            per_cell[r + c] = diff
            used.add(diff.interval)
            if diff.mean is None:
                texts.append(DASH)
            elif diff.low is None:
                texts.append(f"{diff.mean:+.{d}f} (1 pair)")
            else:
                texts.append(f"{diff.mean:+.{d}f} [{diff.low:+.{d}f}, {diff.high:+.{d}f}]" + (" *" if diff.excludes_zero else ""))
        body.append([name[r], *texts])
    unit = "percentage points" if spec["percent"] else spec["metric"]
    kinds = " and ".join(sorted(i for i in used if i)) or "none (fewer than 2 pairs)"
    spec["interval_kinds"] = kinds
    blocks = [render.heading(f"Paired difference to {name[base]}", 4), render.grid(header, body)]
    blocks.append(render.text(
        f"Each cell: mean over the seeds both have of (row − {name[base]}), in {unit}, and its 95% interval: "
        f"a paired t interval for fewer than {stats.BOOTSTRAP_FROM} pairs, a BCa bootstrap (9,999 resamples, "
        f"seeded) from {stats.BOOTSTRAP_FROM} on (used here: {kinds}); * the interval excludes 0."))
    return blocks + rank_blocks(layout, spec, name, folder), per_cell


def rank_blocks(layout: dict, spec: dict, name: dict, folder: Path) -> list[render.Block]:
    """Average ranks over the columns every row has, the Friedman test and (3+ rows, 3+ columns) the CD diagram.
    A comparison's tuned and default columns are ranked apart (never against each other), with how tuning moved
    each method."""
    higher = spec["metric"] not in TO_TARGET
    groups: dict[str, list] = {}
    at = spec["columns"].index(TUNING) if TUNING in spec["columns"] else None
    for c in layout["cols"]:
        groups.setdefault(c[at] if at is not None else "", []).append(c)
    ranked = {}
    for kind, cols in groups.items():
        table = {name[r]: {c: measure(layout["cells"].get(r + c, []), spec)["mean"] for c in cols} for r in layout["rows"]}
        ranked[kind] = (table, *stats.average_ranks(table, higher_is_better=higher))
    if not any(ranks for _, ranks, _ in ranked.values()):
        return [render.text("No column has a value for every row: no ranks.")]
    counts = sorted({n for _, _, n in ranked.values()})
    what = "setting" if at is not None else "column"
    header = [spec.get("row_header") or "row"] + [f"average rank{f' ({kind})' if kind else ''}" for kind in ranked]
    order = list(name.values())
    moved = at is not None and {"tuned", "defaults"} <= set(ranked)
    if moved:
        header.append("moved (rank with defaults − rank tuned; + moved up by tuning)")
    body = []
    for m in order:
        cells = [f"{ranks[m]:.2f}" if m in ranks else DASH for _, ranks, _ in ranked.values()]
        if moved:
            d, t = ranked["defaults"][1].get(m), ranked["tuned"][1].get(m)
            cells.append(f"{d - t:+.2f}" if d is not None and t is not None else DASH)
        body.append([m, *cells])
    blocks = [render.heading(f"Average rank over {', '.join(map(str, counts))} {what}(s) (1 = best)", 4),
              render.grid(header, body), render.text(stats.rank_definition(what))]
    for kind, (table, ranks, n) in ranked.items():
        test = stats.friedman(table)
        of = f" ({kind})" if kind else ""
        blocks.append(render.text(f"Friedman test{of} over {n} {what}s: chi² = {test[0]:.3f}, p = {test[1]:.4g}." if test
                                  else f"Friedman test{of}: needs at least 3 rows and 2 {what}s."))
        if len(ranks) >= 3 and n >= 3:
            cd = stats.critical_difference(len(ranks), n)
            path = stats.cd_diagram(ranks, cd, folder / f"cd_diagram{'_' + kind if kind and kind != 'tuned' else ''}.png")
            blocks.append(render.text(f"Critical difference{of} (Nemenyi, alpha = 0.05): {cd:.2f}; rows joined in "
                                      f"`{path.name}` are not significantly apart."))
    return blocks
