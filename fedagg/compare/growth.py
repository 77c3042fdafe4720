"""A comparison folder grows: run again with more confirm seeds or a larger budget, the same command adds the
missing runs to it (the design of the trials continues, study.py). Anything else that differs from the folder's
protocol.json is refused in one line naming the setting, and a confirm run a grown budget made stale (its method's
choice changed) is moved aside, not overwritten."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from fedagg.results.values import find

log = logging.getLogger("fedagg")
GROWS = ("budget", "confirm_seeds")  # what a rerun may raise
LAUNCH_ONLY = ("batch",)  # how trials are launched: the design does not depend on it


def _shown(value) -> str:
    """A setting as the command line writes it."""
    if isinstance(value, list):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    return "null" if value is None else str(value)


def refusal(saved: dict, record: dict, folder: Path) -> str | None:
    """Why `record` (this command's protocol, run arguments and design) cannot continue the comparison whose
    protocol.json is `saved`, in one line naming the setting; None when it can (the same, or grown)."""
    where, keep = f"hydra.sweep.dir={folder}", "nothing was changed"
    if saved.get("design") != record["design"]:
        return (f"{where} holds a comparison whose trials were chosen another way (protocol.json has design="
                f"{saved.get('design')!r}, this version tunes with {record['design']!r}); {keep}: give another "
                "hydra.sweep.dir")
    old, new = saved["protocol"], record["protocol"]
    for key in new:
        if key in GROWS or key in LAUNCH_ONLY or old.get(key) == new[key]:
            continue
        return (f"{where} holds a comparison with {key}={_shown(old.get(key))} (protocol.json), not "
                f"{key}={_shown(new[key])}; {keep}: rerun with {key}={_shown(old.get(key))}, or give another "
                "hydra.sweep.dir")
    if new["budget"] < old["budget"]:
        return (f"budget={new['budget']} is below the {old['budget']} trials per method {where} holds (protocol.json); "
                f"a comparison grows, it does not shrink: give budget={old['budget']} or more, or another "
                "hydra.sweep.dir")
    if missing := [s for s in old["confirm_seeds"] if s not in new["confirm_seeds"]]:
        return (f"confirm_seeds={_shown(new['confirm_seeds'])} leaves out seed {missing[0]} of the confirm seeds "
                f"{_shown(old['confirm_seeds'])} {where} holds (protocol.json); a comparison grows, it does not "
                f"shrink: give confirm_seeds={len(old['confirm_seeds'])} or more, or a list holding those seeds")
    if saved["arguments"] != record["arguments"]:
        there = [a for a in saved["arguments"] if a not in record["arguments"]]
        here = [a for a in record["arguments"] if a not in saved["arguments"]]
        differ = (f"{' '.join(there) or 'nothing'} there, {' '.join(here) or 'nothing'} here" if there or here else
                  f"the same ones in another order: {' '.join(saved['arguments'])} there")
        return (f"{where} holds a comparison with other run settings (protocol.json: {differ}); {keep}: rerun with "
                f"its settings, or give another hydra.sweep.dir")
    return None


def grown(saved: dict, record: dict) -> list[str]:
    """The log lines that say what a rerun adds."""
    old, new = saved["protocol"], record["protocol"]
    lines = []
    if new["budget"] > old["budget"]:
        lines.append(f"budget {old['budget']} -> {new['budget']}: each method's design goes on with "
                     f"{new['budget'] - old['budget']} more trial(s)")
    if added := [s for s in new["confirm_seeds"] if s not in old["confirm_seeds"]]:
        lines.append(f"confirm seeds {_shown(old['confirm_seeds'])} -> {_shown(new['confirm_seeds'])}: "
                     f"{len(added)} more confirm run(s) per configuration")
    return lines


def set_aside_stale(folder: Path, method: str, params: dict) -> Path | None:
    """Move confirm/tuned/<method> aside (to superseded/) when its runs were run with another choice than
    `params` (a grown budget found a better trial): the new choice's runs then start afresh, and nothing run
    before is lost. Returns where they went, or None."""
    runs = folder / "confirm" / "tuned" / method
    for summary in sorted(runs.glob("s*/summary.json")) if runs.exists() else []:
        config = json.loads(summary.read_text()).get("config") or {}
        if any(find(config, k) != v for k, v in params.items()):  # MISSING equals no value
            n = 0
            while (target := folder / "superseded" / f"tuned-{method}-{n}").exists():
                n += 1
            target.parent.mkdir(exist_ok=True)
            os.replace(runs, target)
            log.info("%s: its choice changed with the grown budget; its earlier confirm runs moved to %s", method, target)
            return target
    return None
