"""The run's result files: `metrics.csv` grows row by row, JSON files are replaced atomically.

Each metrics row is flushed as it is written, so a run that stops early still leaves
every evaluated round on disk.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path


def write_json(path: Path, obj) -> None:
    """Write via a temp file and rename, so readers never see half a file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=_jsonable)
        f.write("\n")
    os.replace(tmp, path)


def _jsonable(value):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def clean_number(value):
    """NaN and infinity become empty CSV cells / JSON null rather than invalid tokens."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class CSVLog:
    """A CSV file that grows by rows (metrics.csv, weights.csv)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[dict] = []
        self.columns: list[str] = []

    def reset(self, rows: list[dict]) -> None:
        """Start over from `rows` (a resumed run's rows up to its checkpoint) and rewrite the file."""
        self.rows, self.columns = [], []
        if self.path.exists():
            self.path.unlink()
        if rows:
            self.extend(rows)

    def append(self, row: dict) -> None:
        self.extend([row])

    def extend(self, rows) -> None:
        rows = list(rows)
        self.rows += rows
        new = [k for row in rows for k in row if k not in self.columns]
        if new or not self.path.exists():
            # a column appeared (or first rows): rewrite the file with the wider header
            self.columns += list(dict.fromkeys(new))
            with open(self.path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self.columns)
                writer.writeheader()
                writer.writerows(self.rows)
            return
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.columns).writerows(rows)
