"""A comparison folder (`python -m fedagg.compare`) as the results layer reads it.

Its test-set runs are the confirm runs, `confirm/tuned/<method>/s<seed>` and
`confirm/default/<method>/s<seed>`; the tuning runs below `tune/` score validation data and
are never tabled beside them. Each confirm run gets the cell key `tuning` (`tuned` or
`defaults`), so that a table puts a method's tuned and default results side by side; the
comparison's `baseline` is the table's unless one is given. A folder holding several
comparisons (one per setting, say) gives one column per setting they differ in.
"""

from __future__ import annotations

import json
from pathlib import Path

from fedagg.results.checks import NOT_SETTINGS  # where files are, how the runs ran: no part of a setting
from fedagg.results.runs import ResultsError, find_run_dirs, overrides_of, read_run

PROTOCOL = "protocol.json"
TUNING = "tuning"
KINDS = (("tuned", "tuned"), ("default", "defaults"))  # confirm/<folder> -> the `tuning` value shown


def protocol_files(folder: Path) -> list[Path]:
    """The protocol.json of every comparison at or below folder."""
    folder = Path(folder)
    if (folder / PROTOCOL).exists():
        return [folder / PROTOCOL]
    return sorted(folder.rglob(PROTOCOL)) if folder.is_dir() else []


def read_protocol(path: Path) -> dict:
    try:
        record = json.loads(Path(path).read_text())
        return {"protocol": dict(record["protocol"]), "arguments": list(record.get("arguments") or [])}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ResultsError(f"{path} is damaged ({type(err).__name__}: {err}); it records the comparison's "
                           "settings: rerun the comparison's command to write it again") from None


def is_comparison(folder: Path) -> bool:
    return bool(protocol_files(folder))


def confirm_runs(folder: Path) -> list[dict]:
    """Every confirm run of the comparisons at or below folder, with `tuning` and `comparison` (its folder)."""
    folder, runs = Path(folder), []
    for path in protocol_files(folder):
        root = path.parent
        for sub, shown in KINDS:
            below = root / "confirm" / sub
            for run_dir in find_run_dirs([below]) if below.exists() else []:
                run = read_run(run_dir, folder)
                run[TUNING], run["comparison"] = shown, str(root.relative_to(folder)) if root != folder else "."
                runs.append(run)
    return runs


def runs_below(folder: Path) -> list[dict]:
    """The runs below one folder of a comparison (tune/<method>, confirm/tuned/<method>, ...) that wrote a summary."""
    return [r for r in (read_run(d, folder) for d in find_run_dirs([folder])) if r["_has_summary"]] if folder.exists() else []


def baseline(folder: Path) -> str | None:
    """The comparisons' baseline when they agree on one."""
    named = {read_protocol(p)["protocol"].get("baseline") for p in protocol_files(folder)}
    return named.pop() if len(named) == 1 else None


def methods(folder: Path) -> list[str]:
    """The comparisons' methods in the order their commands gave them."""
    return list(dict.fromkeys(m for p in protocol_files(folder) for m in read_protocol(p)["protocol"].get("methods") or []))


def setting_columns(runs: list[dict]) -> list[str]:
    """The command-line keys that tell the comparisons apart (constant within each): a column each."""
    by_comparison: dict[str, list[dict]] = {}
    for run in runs:
        by_comparison.setdefault(run["comparison"], []).append(run)
    if len(by_comparison) < 2:
        return []
    values: dict[str, set] = {}
    for group in by_comparison.values():
        keys = {k for run in group for k in overrides_of(run)} | {f"choices.{g}" for run in group for g in (run.get("choices") or {})}
        for key in keys:
            seen = {_value(run, key) for run in group}
            if len(seen) == 1:
                values.setdefault(key, set()).add(seen.pop())
            else:
                values.setdefault(key, set()).add(None)  # varies within a comparison: a method's tuned value
    return [k.removeprefix("choices.") for k, v in values.items() if None not in v and len(v) > 1
            and k.removeprefix("choices.") not in ("seed", "aggregator", "client/objective")]


def _value(run: dict, key: str):
    if key.startswith("choices."):
        return (run.get("choices") or {}).get(key.removeprefix("choices."))
    return overrides_of(run).get(key)


def setting_text(folder: Path) -> str:
    """The comparison's setting in words, from its command line: `dataset=mnist, partition.alpha=0.1, ...`."""
    files = protocol_files(folder)
    if len(files) != 1:
        return ""
    arguments = [a for a in read_protocol(files[0])["arguments"]
                 if not a.startswith("hydra") and not a.lstrip("+~").startswith(NOT_SETTINGS)]
    return ", ".join(arguments)
