#!/usr/bin/env python
"""scripts/compare_runs.py BEFORE_DIR AFTER_DIR (what scripts/same_results.sh recorded before and after a change): every run folder (a folder holding metrics.csv) under either tree, compared:
weights.csv byte for byte, model.pt's tensors with torch.equal (max |diff| when not), and metrics.csv cell by
cell as strings without the elapsed_s column. One line per run; exit 1 if anything differs or is missing."""
import csv
import sys
from pathlib import Path

import torch

IGNORED_COLUMNS = {"elapsed_s"}


def runs(root: Path) -> set[str]:
    return {str(p.parent.relative_to(root)) for p in root.rglob("metrics.csv")}


def tensors(obj, prefix=""):
    """Flatten a loaded model.pt (a state dict, or nested dicts/lists of tensors) into {path: tensor or value}."""
    out = {}
    if isinstance(obj, torch.Tensor):
        out[prefix or "."] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(tensors(v, f"{prefix}/{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(tensors(v, f"{prefix}[{i}]"))
    else:
        out[prefix or "."] = obj
    return out


def max_abs(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} vs {b.dtype}"
    if a.is_floating_point() or a.is_complex():
        return f"max |diff| {(a.double() - b.double()).abs().max().item():.3g}"
    return f"max |diff| {(a.long() - b.long()).abs().max().item()}"


def compare_model(pa: Path, pb: Path) -> list[str]:
    if not pa.exists() and not pb.exists():
        return []
    if not pa.exists() or not pb.exists():
        return [f"model.pt missing in {'before' if not pa.exists() else 'after'}"]
    a = tensors(torch.load(pa, map_location="cpu", weights_only=False))
    b = tensors(torch.load(pb, map_location="cpu", weights_only=False))
    diffs = [f"model.pt: key {k} only in {'before' if k in a else 'after'}" for k in sorted(a.keys() ^ b.keys())]
    for k in a.keys() & b.keys():
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if not (x.dtype == y.dtype and torch.equal(x, y)):
                diffs.append(f"model.pt: {k} {max_abs(x, y)}")
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or x != y:
            diffs.append(f"model.pt: {k} {x!r} vs {y!r}")
    return diffs


def compare_weights(pa: Path, pb: Path) -> list[str]:
    if not pa.exists() and not pb.exists():
        return []
    if not pa.exists() or not pb.exists():
        return [f"weights.csv missing in {'before' if not pa.exists() else 'after'}"]
    if pa.read_bytes() == pb.read_bytes():
        return []
    return ["weights.csv: " + describe_csv(read_csv(pa), read_csv(pb), set())]


def read_csv(p: Path) -> list[list[str]]:
    with open(p, newline="") as f:
        return list(csv.reader(f))


def describe_csv(a: list[list[str]], b: list[list[str]], ignored: set[str]) -> str | None:
    """None when equal (ignored columns aside), else which rows/columns differ and the max |diff| per column."""
    if not a or not b:
        return "empty file" if a != b else None
    ha, hb = a[0], b[0]
    if ha != hb:
        return f"header differs: {ha} vs {hb}"
    keep = [i for i, h in enumerate(ha) if h not in ignored]
    if len(a) != len(b):
        head = f"{len(a) - 1} vs {len(b) - 1} rows; "
    else:
        head = ""
    cols: dict[str, list] = {}
    for r, (ra, rb) in enumerate(zip(a[1:], b[1:]), start=1):
        for i in keep:
            va = ra[i] if i < len(ra) else "<none>"
            vb = rb[i] if i < len(rb) else "<none>"
            if va != vb:
                entry = cols.setdefault(ha[i], [0, 0.0, True, r])
                entry[0] += 1
                try:
                    entry[1] = max(entry[1], abs(float(va) - float(vb)))
                except ValueError:
                    entry[2] = False
    if not cols:
        return head.rstrip("; ") or None
    parts = []
    for c, (n, d, numeric, first) in cols.items():
        parts.append(f"{c} ({n} rows from row {first}" + (f", max |diff| {d:.3g})" if numeric else ", non-numeric)"))
    return head + ", ".join(parts)


def compare_metrics(pa: Path, pb: Path) -> list[str]:
    if not pa.exists() or not pb.exists():
        return [f"metrics.csv missing in {'before' if not pa.exists() else 'after'}"]
    d = describe_csv(read_csv(pa), read_csv(pb), IGNORED_COLUMNS)
    return [] if d is None else [f"metrics.csv: {d}"]


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    before, after = Path(sys.argv[1]), Path(sys.argv[2])
    names = sorted(runs(before) | runs(after))
    if not names:
        print("no run folders (metrics.csv) found")
        return 1
    bad = 0
    for name in names:
        a, b = before / name, after / name
        if not (a / "metrics.csv").exists() or not (b / "metrics.csv").exists():
            diffs = [f"run only in {'after' if not (a / 'metrics.csv').exists() else 'before'}"]
        else:
            diffs = (compare_metrics(a / "metrics.csv", b / "metrics.csv")
                     + compare_weights(a / "weights.csv", b / "weights.csv")
                     + compare_model(a / "model.pt", b / "model.pt"))
        if diffs:
            bad += 1
            print(f"{name}: differs: " + "; ".join(diffs))
        else:
            print(f"{name}: identical")
    print(f"{len(names) - bad} of {len(names)} runs identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
