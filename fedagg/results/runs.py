"""Run folders into Python and pandas: the one reader of summary.json, metrics.csv, weights.csv, clients.csv.

A run folder is one that holds `summary.json`, or the `config.yaml` a run writes when it
starts. A run with no summary.json yet is `running` while the process named in its `.owner`
lock file is alive (on this machine), else `interrupted` (killed before it could write
one; `checkpoint.pt` then says how far it got). A run being resumed is `running` too, even
though its folder still holds the summary of the earlier, interrupted attempt.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

import pandas as pd
import yaml

from fedagg.results.derived import add_derived
from fedagg.results.groups import RECORDED_CHOICES, method_name_of, method_of
from fedagg.results.integrity import damage

RUN_FILES = ("summary.json", "config.yaml")
STARTED = (".owner", "metrics.csv", "checkpoint.pt")  # beside a config.yaml: a run began here (not W&B's config.yaml)
IDENTITY = ("run", "status", "seed", "method", "method_name")  # with the group choices and the varying overrides:
# what names a run
PHASE = ("phase", "trial", "tuning", "val_score", "chosen")  # a comparison's run: which stage, trial and configuration


class ResultsError(ValueError):
    """Results that cannot be read or shown honestly; the message is one line that names the file or key."""


def natural(path: Path) -> list:
    """Sort key that puts sweep job 2 before job 10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def find_run_dirs(paths: list[Path]) -> list[Path]:
    """The run folders given, or found below the folders given, in natural order."""
    found = []
    for path in map(Path, paths):
        if not path.exists():
            raise ResultsError(f"{path} does not exist; give a run folder or a sweep folder")
        if is_run_dir(path):
            found.append(path)
        else:
            below = {p.parent for name in RUN_FILES for p in path.rglob(name)}
            found += sorted((d for d in below if is_run_dir(d)), key=natural)
    return list(dict.fromkeys(found))


def is_run_dir(path: Path) -> bool:
    return (path / "summary.json").exists() or (
        (path / "config.yaml").exists() and any((path / name).exists() for name in STARTED))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _owner_alive(run_dir: Path) -> bool:
    try:
        return _pid_alive(int((run_dir / ".owner").read_text().strip()))
    except (OSError, ValueError):
        return False


def read_summary(path: Path) -> dict:
    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ResultsError(f"{path} is damaged ({type(err).__name__}: {err}); repair or remove that run folder") from None
    if not isinstance(summary, dict):
        raise ResultsError(f"{path} is damaged (not a JSON object); repair or remove that run folder")
    for key in [k for k, v in summary.items() if k.endswith("_infinite") and v is True]:
        value = key.removesuffix("_infinite")
        if summary.get(value) is None:
            summary[value] = math.inf  # JSON has no infinity: the run wrote null and this flag (ε without noise)
    return summary


def read_run(run_dir: Path, root: Path | None = None) -> dict:
    """A run's summary (or, before it wrote one, its config.yaml as `config`) with its status, and
    `_dir` (relative to root), `_path` and `_has_summary`."""
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        run = read_summary(summary_path)
        run["_has_summary"] = True
    else:
        try:
            config = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").exists() else {}
        except yaml.YAMLError:
            config = {}
        config = config if isinstance(config, dict) else {}
        run = {"status": "interrupted", "seed": config.get("seed"), "config": config, "_has_summary": False}
        if (run_dir / "checkpoint.pt").exists():
            run["checkpoint"] = True
    if _owner_alive(run_dir):
        run["status"] = "running"
    choices, config = run.get("choices") or {}, run.get("config") or {}
    if run.get("method") is None:  # runs from before summary.json named their method
        run["method"], run["method_name"] = method_of(choices, config), method_name_of(choices, config)
    rel = run_dir.relative_to(root) if root is not None and run_dir.is_relative_to(root) else run_dir
    run["_dir"], run["_path"] = str(rel) if str(rel) != "." else ".", run_dir
    run.update(comparison_phase(run_dir))
    return run


def comparison_phase(run_dir: Path) -> dict:
    """Where a run of a comparison (`python -m fedagg.compare`) stands in it, from its place in the folder: a tuning
    trial, `tune/<method>/t<trial>/s<seed>` -> phase `tune`, its `trial` and the trial's `val_score` and `chosen`
    (selection.csv: the score that chose, the mean over the tuning seeds); a confirm run,
    `confirm/{tuned,default}/<method>/s<seed>` -> phase `confirm` and `tuning` (`tuned` or `defaults`). {} elsewhere."""
    parts = Path(run_dir).resolve().parts
    if len(parts) < 5 or parts[-4] not in ("tune", "confirm") or not (root := Path(*parts[:-4])).joinpath(
            "protocol.json").exists():
        return {}
    if parts[-4] == "confirm":
        return {"phase": "confirm", "tuning": {"default": "defaults"}.get(parts[-3], parts[-3])}
    trial = int(match[1]) if (match := re.fullmatch(r"t(\d+)", parts[-2])) else None
    row = _selection(root).get((parts[-3], trial), {})
    return {"phase": "tune", "trial": trial, "val_score": row.get("val_score"), "chosen": row.get("chosen")}


def _selection(root: Path) -> dict[tuple[str, int], dict]:
    """(method, trial) -> that trial's row of the comparison's selection.csv (none while it is tuning)."""
    frame = load_trials(root) if (root / "selection.csv").exists() else pd.DataFrame()
    return {(r["method"], int(r["trial"])): r for r in frame.to_dict("records")}


def load_trials(folder: str | Path) -> pd.DataFrame:
    """A comparison's trials, one row each (its selection.csv): `method`, `trial`, `val_score` (the validation
    score that chose: the mean over the tuning seeds of the last ⌈R/10⌉ evaluations' validation accuracy), `chosen`,
    `params` (JSON, as written) and each tuned setting as its own column (`client.lr`, ...)."""
    path = Path(folder) / "selection.csv"
    if not path.exists():
        raise ResultsError(f"{path} does not exist: give a comparison's folder (python -m fedagg.compare's "
                           "hydra.sweep.dir) after its tuning finished")
    try:
        frame = pd.read_csv(path, dtype={"method": str, "params": str})
        params = pd.DataFrame([json.loads(p) for p in frame["params"]], index=frame.index)
        frame["chosen"] = frame["chosen"].astype(str).str.lower() == "true"
    except (pd.errors.ParserError, pd.errors.EmptyDataError, KeyError, ValueError) as err:
        raise ResultsError(f"{path} is damaged ({type(err).__name__}: {err}); rerun the comparison's command") from None
    return pd.concat([frame, params.drop(columns=[c for c in params if c in frame])], axis=1)


def read_runs(folder: Path) -> list[dict]:
    """Every run below folder (read_run's dicts); ResultsError for a folder that does not exist or a damaged file."""
    folder = Path(folder)
    return [read_run(d, folder) for d in find_run_dirs([folder])]


def flatten(node, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    if not isinstance(node, dict) or (not node and prefix):
        return {prefix[:-1]: node}
    out = {}
    for key, value in node.items():
        out.update(flatten(value, f"{prefix}{key}."))
    return out


def overrides_of(run: dict) -> dict:
    """The command line's `key=value` overrides of a run, as a dict (Hydra's `+`/`~` prefixes dropped)."""
    out = {}
    for item in run.get("overrides") or []:
        key, sep, value = str(item).partition("=")
        if sep:
            out[key.lstrip("+~")] = value
    return out


def varying_overrides(runs: list[dict]) -> list[str]:
    """The override keys whose value differs across the runs (or that some runs lack)."""
    per_run = [overrides_of(r) for r in runs]
    keys = dict.fromkeys(k for o in per_run for k in o)
    return [k for k in keys if len({o.get(k) for o in per_run}) > 1]


def sweep_frame(runs: list[dict]) -> pd.DataFrame:
    """load_sweep's table from read_run's dicts."""
    varying = varying_overrides(runs)
    rows = []
    for run in runs:
        row = {"run": run["_dir"], "status": run.get("status"), "seed": run.get("seed"), "method": run.get("method"),
               "method_name": run.get("method_name"), "damaged": damage(run)}
        choices = run.get("choices") or {}
        row.update({group: choices.get(group) for group in RECORDED_CHOICES})
        fields = {k: v for k, v in run.items() if not k.startswith("_") and k not in ("choices", "overrides")}
        row.update({k: v for k, v in flatten(fields).items() if k not in row})
        overrides = overrides_of(run)
        row.update({k: overrides.get(k) for k in varying if k not in row})
        row["path"] = str(run["_path"])
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame = frame[[c for c in frame if c in IDENTITY or frame[c].notna().any()]]  # no column of a group nobody chose
    # (`damaged` too is there only when some run's files are: "<file> is damaged: <why>")
    if "trial" in frame:
        frame["trial"] = frame["trial"].astype("Int64")  # a confirm run has none: no float trial numbers
    frame.attrs["varying"] = [k for k in varying if k in frame]
    return frame


def load_sweep(folder: str | Path) -> pd.DataFrame:
    """One row per run folder below `folder` (or the one run folder given): `run` (its folder, relative),
    `status`, `seed`, `method` (the aggregator, or the client objective it runs with: fedprox) and `method_name`
    (its YAML's display_name), in a comparison's folder `phase` (`tune` or `confirm`), a trial's `trial`,
    `val_score` and `chosen`, a confirm run's `tuning` (`tuned` or `defaults`), `damaged` where a run's metrics.csv or weights.csv is not what it wrote (why), every group choice (`aggregator`, `dataset`, ...), every summary.json field flattened
    (`final_test_acc`, `config.aggregator.lr`, ...), the overrides that vary across the runs, and `path`;
    from the runs' CSV files `last_k_test_acc` (k = ⌈R/10⌉: `last_k`), and with per-client evaluation
    `final_client_jain` and `final_client_acc_gap10` (fedagg.results.derived says how each is computed).
    Runs without a summary.json are there as `running` or `interrupted`."""
    return sweep_frame([add_derived(run) for run in read_runs(Path(folder))])


def _long(folder: str | Path, filename: str) -> pd.DataFrame:
    sweep = load_sweep(folder)
    ids = [c for c in sweep if c in IDENTITY or c in PHASE or c in RECORDED_CHOICES or c in sweep.attrs["varying"]]
    parts, named = [], ids
    for _, run in sweep.iterrows():
        path = Path(run["path"]) / filename
        if not path.exists() or path.stat().st_size == 0:
            continue
        if isinstance(run.get("damaged"), str):
            print(f"warning: {run['damaged']}; that run is left out", file=sys.stderr)
            continue
        try:
            part = pd.read_csv(path)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
            print(f"warning: {path} is damaged: {type(err).__name__}: {str(err).splitlines()[0]}; that run is left out",
                  file=sys.stderr)
            continue
        # a run column the file also has (the `client` group beside weights.csv's client ids) becomes <name>_choice
        named = [f"{c}_choice" if c in part.columns else c for c in ids]
        for column, name in reversed(list(zip(ids, named))):
            part.insert(0, name, run[column])
        parts.append(part)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=named)


def load_curves(folder: str | Path) -> pd.DataFrame:
    """Every run's metrics.csv in long form (one row per run and evaluated round), led by the run's columns
    (run, status, seed, method, method_name, a comparison's phase, trial, tuning and val_score, the group choices,
    the varying overrides)."""
    return _long(folder, "metrics.csv")


def load_weights(folder: str | Path) -> pd.DataFrame:
    """Every run's weights.csv (round, client, weight, num_samples, ...) led by the run's columns (the `client`
    group's choice as `client_choice`: `client` is the client's id)."""
    return _long(folder, "weights.csv")


def load_clients(folder: str | Path) -> pd.DataFrame:
    """Every run's clients.csv (per-client accuracy at each evaluated round) led by the run's columns (the
    `client` group's choice as `client_choice`)."""
    return _long(folder, "clients.csv")
