"""A table as a paper prints it: one LaTeX `table` with its caption and label, ready for `\\input`.

Rows are the table's rows (methods), columns its settings; each setting has the measured
mean ± sd over seeds and, with a baseline, the paired difference to it with its 95%
interval (and, with a paper's numbers, the paper's value). The best mean of each column is
bold, a difference whose interval excludes 0 is marked *; a cell whose runs all diverged is ×, one without
runs —. The caption says in words what was run (fedagg.results.caption). `width="column"` fits one column of the
page (`table`, shrunk to \columnwidth only when wider), `"page"` spans the page (`table*`, \textwidth).
What the markdown says under the table follows as LaTeX comments. It needs booktabs and graphicx only.
"""

from __future__ import annotations

import math
import re

import pandas as pd

from fedagg.results.caption import value_title
from fedagg.results.values import CROSS, DASH, TO_TARGET, fmt, label

NEEDS = (r"% Needs \usepackage{booktabs} (\toprule, \midrule, \cmidrule, \bottomrule) and \usepackage{graphicx}"
         r" (\resizebox) in the preamble.")
WIDTHS = {"column": ("table", r"\columnwidth"), "page": ("table*", r"\textwidth")}
LOWER_IS_BETTER = TO_TARGET
METRIC_WORDS = {"last_k_test_acc": "Test accuracy averaged over the last k = ⌈R/10⌉ evaluated rounds",
                "final_test_acc": "Test accuracy after the last round",
                "best_test_acc": "Best test accuracy over the rounds (selected on the test set)"}


def plain(paragraph: str) -> str:
    """A markdown paragraph as plain text: no **bold**, no `code` marks."""
    return re.sub(r"`(.+?)`", r"\1", re.sub(r"\*\*(.+?)\*\*", r"\1", paragraph))


def _lower_is_better(metric: str) -> bool:
    return metric in LOWER_IS_BETTER or metric.endswith("_loss")


def _number(value) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9:-]+", "-", str(name)).strip("-") or "table"


def _value_text(record: dict, d: int, n_common: int | None) -> str:
    mean, std = _number(record.get("mean")), _number(record.get("std"))
    measured = str(record.get("measured_text") or "")
    if mean is None:  # the markdown's words: N/A (best accuracy) where the target was never reached, ∞, ×, —
        return measured or (CROSS if record.get("n_diverged") and not record.get("n_completed") else DASH)
    if "reached" in measured:  # some seeds never reached the target: the mean is of those that did, and says so
        return measured
    text = fmt(mean, d) + (f" ± {fmt(std, d)}" if std is not None else "")
    n = int(record.get("n_completed") or 0)
    extra = [f"n={n}"] if n_common is None or n != n_common else []
    if record.get("n_diverged"):
        extra.append(f"{int(record['n_diverged'])} {CROSS}")
    return text + (f" ({', '.join(extra)})" if extra else "")


def _signed(value: float, d: int) -> str:
    return f"{value:+.{d}f}".replace("-", "−")  # a minus sign, not a hyphen, once escaped


def _delta_text(record: dict, d: int, is_baseline: bool) -> str:
    if is_baseline:
        return DASH
    mean, low, high = (_number(record.get(k)) for k in ("diff_to_baseline", "ci_low", "ci_high"))
    if mean is None:
        return DASH
    if low is None:
        return f"{_signed(mean, d)} (1 pair)"
    mark = "*" if record.get("excludes_zero") is True else ""  # as the markdown's: the interval excludes 0
    return f"{_signed(mean, d)}{mark} [{_signed(low, d)}, {_signed(high, d)}]"


def _spans(values: list[str]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1] = (v, out[-1][1] + 1)
        else:
            out.append((v, 1))
    return out


def paper_latex(table, width: str = "column") -> str:
    """The one LaTeX table of a `fedagg.results.render.Table` built by `build_table`, one column (`width="column"`)
    or the page (`"page"`) wide."""
    if width not in WIDTHS:
        raise ValueError(f"width={width!r} is not allowed; it must be one of {', '.join(WIDTHS)}")
    env, limit = WIDTHS[width]
    spec, layout = table.spec, table.layout
    rows_k, cols_k, d = spec["rows"], spec["columns"], spec["decimals"]
    records = {tuple(str(r[k]) for k in [*rows_k, *cols_k]): r for r in table.cells.to_dict("records")}
    rows, cols = layout["rows"], layout["cols"]
    delta = "diff_to_baseline" in table.cells.columns
    paper = bool(spec.get("has_paper"))
    subs = ["value"] + (["delta"] if delta else []) + (["paper"] if paper else [])
    counts = {int(r.get("n_completed") or 0) for r in records.values() if _number(r.get("mean")) is not None}
    n_common = counts.pop() if len(counts) == 1 else None
    base = spec.get("baseline_row")

    best = {}
    for c in cols:
        means = {r: _number(records.get(r + c, {}).get("mean")) for r in rows}
        found = [m for m in means.values() if m is not None]
        if found:
            target = min(found) if _lower_is_better(spec["metric"]) else max(found)
            best[c] = {r for r, m in means.items() if m is not None and round(m, d) == round(target, d)}

    width = len(subs)
    # the tabular is set in a box first and shrunk to the column (page) only when it is wider: a narrow table keeps
    # the text size of the paper, a wide one fits instead of running into the margin
    lines = [NEEDS, rf"\begin{{{env}}}[t]", r"\centering", r"\caption{" + latex_escape(_caption(spec, n_common, delta)) + "}",
             r"\label{tab:" + _slug(spec.get("name", "table")) + "}", r"\small", r"\setlength{\tabcolsep}{4pt}",
             r"\sbox0{\begin{tabular}{l" + "r" * (width * len(cols)) + "}", r"\toprule"]
    for level in range(len(cols_k)):
        cells, rules, at = [], [], 2
        for text, span in _spans([" / ".join(label(spec, k, v) for k, v in zip(cols_k[: level + 1], c[: level + 1]))
                                  for c in cols]):
            shown = latex_escape(text.rsplit(" / ", 1)[-1])
            cells.append(rf"\multicolumn{{{span * width}}}{{c}}{{{shown}}}" if span * width > 1 else shown)
            rules.append(rf"\cmidrule(lr){{{at}-{at + span * width - 1}}}")
            at += span * width
        lines.append(" & ".join(["", *cells]) + r" \\")
        lines.append("".join(rules))
    titles = {"value": value_title(spec), "delta": r"$\Delta$ [95\% CI]", "paper": "Paper"}
    head = latex_escape(spec.get("row_header") or " / ".join(rows_k))
    lines.append(" & ".join([head, *[titles[s] if s != "value" else latex_escape(titles[s]) for _ in cols for s in subs]]) + r" \\")
    lines.append(r"\midrule")
    for r in rows:
        name = " ".join(label(spec, k, v) for k, v in zip(rows_k, r))
        out = [latex_escape(name)]
        for c in cols:
            record = records.get(r + c, {})
            for s in subs:
                if s == "value":
                    text = latex_escape(_value_text(record, d, n_common))
                    out.append(rf"\textbf{{{text}}}" if r in best.get(c, ()) else text)
                elif s == "delta":
                    out.append(latex_escape(_delta_text(record, d, r == base)))
                else:
                    out.append(latex_escape(record.get("paper_text") or DASH))
        lines.append(" & ".join(out) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}}",
              rf"\ifdim\wd0>{limit}\resizebox{{{limit}}}{{!}}{{\usebox0}}\else\usebox0\fi", rf"\end{{{env}}}"]
    notes = [plain(b.text) for b in table.blocks if b.kind == "text"]
    return "\n".join(lines) + "\n" + "".join(f"% {line}\n" for note in notes for line in note.splitlines())


def _caption(spec: dict, n_common: int | None, delta: bool) -> str:
    lead = str(spec.get("latex_lead") or spec.get("caption") or "").rstrip(".")
    if spec.get("setting_words"):
        lead = f"{lead} on {spec['setting_words']}" if lead else spec["setting_words"][:1].upper() + spec["setting_words"][1:]
    lead = lead or str(spec.get("name") or "")
    seeds = f"{n_common} {'confirm ' if spec.get('protocol_words') else ''}seeds" if n_common else "the seeds given per cell (n)"
    unit = ("percentage points" if spec.get("percent") else
            {"time_to_target": "simulated seconds", "rounds_to_target": "rounds"}.get(spec["metric"], spec["metric"]))
    metric = spec.get("metric_words") or METRIC_WORDS.get(spec["metric"], spec["metric"])
    if spec["metric"] == "last_k_test_acc" and spec.get("last_rounds") and not spec.get("metric_words"):
        metric = f"Test accuracy averaged over the last {spec['last_rounds']} rounds"  # the table's window in rounds
    parts = [f"{lead}. {metric}: mean ± sd over {seeds}"]
    if spec["metric"] in TO_TARGET:
        parts.append("N/A (x%): no seed reached the target, best accuracy x")
    if delta and spec.get("baseline_name"):
        parts.append(f"Δ: paired difference to {spec['baseline_name']} over the same seeds, in {unit}, with its 95% "
                     f"interval ({spec.get('interval_kinds') or 'paired t'}); * the interval excludes 0")
    parts.append("best mean per column in bold")
    protocol = f" {spec['protocol_words']}." if spec.get("protocol_words") else ""
    return "; ".join(parts) + "." + protocol


LATEX_SPECIAL = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                 "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
                 "±": r"$\pm$", "×": r"$\times$", "—": "---", "†": r"$^\dagger$", "−": "$-$", "²": r"$^2$",
                 "Δ": r"$\Delta$", "≤": r"$\leq$", "≥": r"$\geq$", "⌈": r"$\lceil$", "⌉": r"$\rceil$",
                 "α": r"$\alpha$", "β": r"$\beta$", "μ": r"$\mu$", "τ": r"$\tau$", "ε": r"$\varepsilon$"}


def latex_escape(value) -> str:
    return "".join(LATEX_SPECIAL.get(ch, ch) for ch in str(value))


def tabular(frame: pd.DataFrame) -> str:
    """One grid as a booktabs tabular (the paired statistics printed alone)."""
    lines = [r"\begin{tabular}{l" + "r" * (len(frame.columns) - 1) + "}", r"\toprule",
             " & ".join(latex_escape(c) for c in frame.columns) + r" \\", r"\midrule"]
    lines += [" & ".join(latex_escape(v) for v in row) + r" \\" for row in frame.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)
