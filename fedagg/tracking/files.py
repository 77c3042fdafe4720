"""The run's result files: the CSV files grow row by row, JSON files are replaced atomically.

Each row is on disk as soon as it is written (and in memory no longer), so a run that
stops early still leaves every evaluated round on disk.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path


def write_json(path: Path, obj, lenient: bool = False) -> None:
    """Write via a temp file and rename, so readers never see half a file (nor a temp file left by an error).
    `lenient`: a value JSON has no type for is written as a list, an object or its text instead of refused (a
    failure's summary, which must be written whatever the configuration holds)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1, default=_readable if lenient else _jsonable)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _jsonable(value):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def _readable(value):
    try:
        return _jsonable(value)
    except Exception:  # noqa: BLE001 - a tensor's item() may fail too: fall back to the containers, then the text
        pass
    if isinstance(value, Mapping):
        return {str(k): v for k, v in value.items()}
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        return list(value)
    return repr(value)


def clean_number(value):
    """NaN becomes an empty CSV cell; infinity stays, written `inf` (ε without noise is infinite, not missing)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def summary_values(values: dict[str, float], prefix: str = "final_") -> dict:
    """Per-round values as summary.json keeps the latest: JSON has no infinity, so an infinite one is null beside
    `<key>_infinite: true` (the results loaders read it back as inf); NaN is null."""
    out = {}
    for key, value in values.items():
        infinite = isinstance(value, float) and math.isinf(value)
        out[f"{prefix}{key}"] = None if isinstance(value, float) and not math.isfinite(value) else value
        if infinite:
            out[f"{prefix}{key}_infinite"] = True
    return out


class CSVLog:
    """A CSV file that grows by rows (metrics.csv, weights.csv, clients.csv), kept on disk only.

    Rows go straight to the file: a run with thousands of clients writes millions of them,
    which neither memory nor every checkpoint should hold. What a checkpoint keeps instead is
    `mark()`: how far the file had got (rows, bytes, header) and a SHA-256 of those bytes,
    enough for `cut(mark)` to return the file to that point on resume and to notice a file
    changed since.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.columns: list[str] = []
        self.count = 0  # rows in the file
        self.size = 0  # its bytes
        self._digest = hashlib.sha256()  # of those bytes, kept up to date as they are written

    def append(self, row: dict) -> None:
        self.extend([row])

    def extend(self, rows) -> None:
        rows = list(rows)
        if not rows:
            return
        new = list(dict.fromkeys(k for row in rows for k in row if k not in self.columns))
        if new or not self.count:
            # a column appeared (or first rows): rewrite the file with the wider header, the
            # earlier rows read back from it (strings, which csv writes back byte for byte)
            self._rewrite(self.columns + new, [*self.read_rows(), *rows])
            return
        data = _encode(self.columns, rows)
        with open(self.path, "ab") as f:
            f.write(data)
        self._grew(data, len(rows))

    def read_rows(self) -> list[dict]:
        """The file's rows as csv reads them (every value a string)."""
        return self.read_rows_of(self.count) if self.count else []

    def mark(self) -> dict:
        """How far the file has got, for a checkpoint: rows, bytes, header and a digest of those bytes."""
        return {"rows": self.count, "bytes": self.size, "columns": list(self.columns),
                "sha256": self._digest.hexdigest()}

    def cut(self, mark: dict) -> None:
        """Return the file to `mark` (rows written after the checkpoint are dropped)."""
        want, size = mark["sha256"], mark["bytes"]
        self.columns, self.count, self.size, self._digest = [], 0, 0, hashlib.sha256()
        if not mark["rows"]:
            self.path.unlink(missing_ok=True)
            return
        head = _prefix(self.path, size)
        if head is not None and hashlib.sha256(head).hexdigest() == want:
            with open(self.path, "r+b") as f:  # the usual case: rows were only appended since
                f.truncate(size)
            self.columns, self.count, self.size = list(mark["columns"]), mark["rows"], size
            self._digest.update(head)
            return
        # a column that appeared after the checkpoint rewrote the file with a wider header:
        # the checkpoint's rows come back from it under the checkpoint's header
        columns = list(mark["columns"])
        rows = [{k: row.get(k) for k in columns} for row in self.read_rows_of(mark["rows"])]
        data = _encode(columns, rows, header=True) if len(rows) == mark["rows"] else b""
        if hashlib.sha256(data).hexdigest() != want:
            raise ValueError(f"{self.path} no longer holds the {mark['rows']} rows the checkpoint recorded (it was "
                             "changed or cut short after it); resume needs the run's files as it left them, or start "
                             "the run again with overwrite=true")
        self._rewrite(columns, rows)

    def read_rows_of(self, limit: int) -> list[dict]:
        """The first `limit` rows of whatever the file holds now."""
        if not self.path.exists():
            return []
        with open(self.path, newline="") as f:
            return [row for _, row in zip(range(limit), csv.DictReader(f))]

    def reset(self, rows: list[dict]) -> None:
        """Start over from `rows` (a checkpoint written before marks, which held the rows themselves)."""
        self.columns, self.count, self.size, self._digest = [], 0, 0, hashlib.sha256()
        self.path.unlink(missing_ok=True)
        self.extend(rows)

    def _rewrite(self, columns: list[str], rows: list[dict]) -> None:
        data = _encode(columns, rows, header=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, self.path)
        self.columns, self.count, self.size, self._digest = columns, 0, 0, hashlib.sha256()
        self._grew(data, len(rows))

    def _grew(self, data: bytes, rows: int) -> None:
        self.count += rows
        self.size += len(data)
        self._digest.update(data)


def _encode(columns: list[str], rows: list[dict], header: bool = False) -> bytes:
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns)
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return text.getvalue().encode()


def _prefix(path: Path, size: int) -> bytes | None:
    """The file's first `size` bytes, or None when it is missing or shorter."""
    if not path.exists() or path.stat().st_size < size:
        return None
    with open(path, "rb") as f:
        return f.read(size)
