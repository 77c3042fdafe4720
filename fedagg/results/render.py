"""A table as data and its renderings: markdown, CSV, LaTeX (booktabs) and HTML.

A `Table` is a list of blocks (headings, grids as DataFrames of display strings, paragraphs)
and `cells`, a DataFrame with one row per cell and its numbers (mean, std, paper value,
paired difference, ...). Every rendering is written from those alone, so the markdown the
terminal shows, the HTML the report embeds and the LaTeX a paper includes cannot disagree.
"""

from __future__ import annotations

import csv
import html
import io
import re
from dataclasses import dataclass, field

import pandas as pd

from fedagg.results.latex import paper_latex, plain, tabular


@dataclass(frozen=True)
class Block:
    kind: str  # "heading", "grid" or "text"
    text: str = ""
    level: int = 0  # of a heading: 3 for the table's title, 4 for its sections
    grid: pd.DataFrame | None = None  # of a grid: display strings; the column labels are the header


def heading(text: str, level: int) -> Block:
    return Block("heading", text, level)


def text(paragraph: str) -> Block:
    return Block("text", paragraph)


def grid(header: list[str], rows: list[list[str]]) -> Block:
    return Block("grid", grid=pd.DataFrame(rows, columns=header, dtype=object))


@dataclass
class Table:
    blocks: list[Block]
    cells: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per cell: keys and numbers
    spec: dict = field(default_factory=dict)  # the layout, metric and format it was built with
    layout: dict = field(default_factory=dict)  # rows, columns and each cell's runs, for figures

    def grids(self) -> list[pd.DataFrame]:
        return [b.grid for b in self.blocks if b.kind == "grid"]

    def to_markdown(self) -> str:
        return "\n\n".join(_markdown(b) for b in self.blocks) + "\n"

    def to_csv(self) -> str:
        """The cells, one line each, floats rounded to 6 digits."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(list(self.cells.columns))
        for row in self.cells.itertuples(index=False):
            writer.writerow([_csv_value(v) for v in row])
        return out.getvalue()

    def to_latex(self, width: str = "column") -> str:
        """A built table: the one LaTeX table a paper includes (fedagg.results.latex), one column or the page
        (`width="page"`) wide. Other blocks (the paired statistics alone): each grid as a booktabs tabular,
        headings and paragraphs as LaTeX comments above it."""
        if self.spec.get("rows") and self.layout.get("rows") is not None:
            return paper_latex(self, width)
        out = []
        for block in self.blocks:
            if block.kind == "grid":
                out.append(tabular(block.grid))
            else:
                out.append("\n".join(f"% {line}" for line in plain(block.text).splitlines()))
        return "\n\n".join(out) + "\n"

    def to_html(self) -> str:
        return "\n".join(_html(b) for b in self.blocks)


def _csv_value(value):
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return round(value, 6) if isinstance(value, float) else value


def _markdown(block: Block) -> str:
    if block.kind == "heading":
        return "#" * block.level + " " + block.text
    if block.kind == "text":
        return block.text
    frame = block.grid
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def _inline_html(paragraph: str) -> str:
    """The markdown a paragraph may hold (**bold**, `code`) as HTML, the rest escaped."""
    escaped = html.escape(paragraph)
    escaped = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", escaped)


def _html(block: Block) -> str:
    if block.kind == "heading":
        level = min(block.level + 1, 5)  # the report's page has h1 and h2 above a table's title
        return f"<h{level}>{html.escape(block.text)}</h{level}>"
    if block.kind == "text":
        return f"<p>{_inline_html(block.text)}</p>"
    frame = block.grid
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
                   for row in frame.itertuples(index=False))
    return f"<table><tr>{head}</tr>{body}</table>"
