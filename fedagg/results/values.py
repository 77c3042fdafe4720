"""The values a table shows: where a cell key is in summary.json, one spelling per value, number formats."""

from __future__ import annotations

import math

DASH, CROSS = "—", "×"


MISSING = object()


def find(summary: dict, path: str):
    """The value at a dotted path, MISSING where the path is not there (None is a value)."""
    node = summary
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def lookup(summary: dict, path: str):
    """The value at a dotted path, None where the path is not there."""
    value = find(summary, path)
    return None if value is MISSING else value


def key_text(value) -> str:
    """One spelling per value, whether it came from YAML, JSON or a CSV cell: 100.0 -> '100'."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(int(value)) if float(value).is_integer() else repr(float(value))
    text = str(value).strip()
    try:
        return key_text(float(text)) if text not in ("nan", "inf", "-inf") else text
    except ValueError:
        return text


def number(text) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def fmt(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}"


def label(spec: dict, name: str, value: str) -> str:
    labels = (spec.get("labels") or {}).get(name) or {}
    return str(labels.get(value, labels.get(str(value), value)))
