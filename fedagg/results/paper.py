"""A paper's published numbers (paper_results/<table>.csv) beside the measured cells."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from fedagg.results.values import CROSS, DASH, fmt, number

ROOT = Path(__file__).resolve().parents[2]  # paper_results/ paths in the tables are relative to the repository


def load_paper(spec: dict) -> list[dict]:
    """The paper's cells; a leading `# metric: KEY (why)` line says which summary.json key the
    paper's numbers are (kept in spec["paper_metric"])."""
    path = spec.get("paper")
    if not path:
        return []
    path = Path(path) if Path(path).is_absolute() else ROOT / path
    if not path.exists():
        print(f"warning: no paper numbers at {path}", file=sys.stderr)
        return []
    rows, spec["paper_metric"] = read_paper(path)
    return rows


def read_paper(path: Path) -> tuple[list[dict], str | None]:
    """A paper_results CSV: its cells, and its `# metric: KEY (why)` line without the prefix."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    metric = next((line.removeprefix("# metric:").strip() for line in lines if line.startswith("# metric:")), None)
    return list(csv.DictReader(line for line in lines if not line.startswith("#"))), metric


def paper_cell(row: dict | None, spec: dict) -> tuple[float | None, str]:
    if row is None:
        return None, DASH
    raw = (row.get("paper") or "").strip()
    value = number(raw)
    if value is not None:
        return value, fmt(value, spec["decimals"])
    if raw in ("x", "X", CROSS):
        return None, CROSS
    if raw.upper() == "N/A":
        best = number(row.get("paper_best"))
        return None, f"N/A ({best:.2f}%)" if best is not None else "N/A"
    return None, raw or DASH
