"""A method's search space, read from the `Tune` declarations of the constructors its config instantiates.

A method is a config option: an aggregator (`aggregator=NAME`) or a client objective (`client/objective=NAME`).
Its space is every declared `Tune` of the aggregator and client nodes of its composed config (nested nodes
such as a client half included), keyed by the dotted config key a trial overrides (`aggregator.lr`,
`client.objective.mu`, `client.lr`). The client's rate lives on the one client constructor, so every method
searches it over the same range.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

from fedagg.config.constraints import Tune, constraints, tunables
from fedagg.config.schema import locate

METHOD_GROUPS = ("aggregator", "client")  # the config subtrees whose declared ranges a method's space holds


@dataclass(frozen=True)
class Param:
    key: str  # dotted config key, e.g. "aggregator.tau"
    tune: Tune
    default: object  # the value of the method's composed config: its YAML's, or the command line's when fixed
    fixed: bool = False  # set on the command line: not searched, every run of the method takes `default`


def _target(path: str, key: str):
    target = locate(path, key)  # an own module Python cannot find: one line, as a run says it
    return target.__init__ if inspect.isclass(target) else target


def _walk(node: dict, prefix: str, interpolated: set[str]):
    target = node.get("_target_")
    if target:
        fn = _target(target, f"{prefix}_target_")
        declared, limits = tunables(fn), constraints(fn)
        for name, tune in declared.items():
            key = f"{prefix}{name}"
            if name in node and key not in interpolated:  # a value tied to another key is tuned through that key
                yield Param(key, tune, node[name]), limits.get(name)
    for name, value in node.items():
        if isinstance(value, dict):
            yield from _walk(value, f"{prefix}{name}.", interpolated)


def search_space(config: dict, interpolated: set[str] = frozenset()) -> list[Param]:
    """The declared ranges of a composed config's method nodes, in key order; refuses an unusable range in one
    line naming the key (an empty range, a log range that is not positive, ends the constructor refuses)."""
    found = []
    for group in METHOD_GROUPS:
        if isinstance(config.get(group), dict):
            found += list(_walk(config[group], f"{group}.", set(interpolated)))
    params = []
    for param, limit in found:
        problem = param.tune.problem()
        if problem is None and limit is not None:
            bad = [end for end in (param.tune.low, param.tune.high)
                   if not limit[0].accepts(int(end) if param.tune.integer else float(end))]
            if bad:
                problem = f"its end {bad[0]:g} is not a value {param.key} accepts ({limit[0].allowed})"
        if problem is not None:
            raise ValueError(f"search range of {param.key}: {problem}; correct its Tune(...) declaration")
        params.append(param)
    return sorted(params, key=lambda p: p.key)


def _scale(t: Tune) -> tuple[float, float]:
    return (math.log(t.low), math.log(t.high)) if t.log else (float(t.low), float(t.high))


def _short(v: float) -> float:
    return float(f"{v:.6g}")  # short, exact in the override strings


def default_problem(param: Param) -> str | None:
    """Why the method's default cannot be its first trial (it is not a number), or None."""
    d = param.default
    if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d):
        return f"its default {d!r} is not a number"
    return None


def outside(param: Param) -> bool:
    """The default lies outside the declared range: the defaults trial runs it as it is, the others stay inside."""
    return not param.tune.low <= param.default <= param.tune.high


def point(param: Param, u: float) -> float | int:
    """The value at the share `u` in [0, 1) of the range, in its own scale (log or linear); whole for an integer
    range, kept within the range."""
    t = param.tune
    lo, hi = _scale(t)
    v = lo + (hi - lo) * u
    v = math.exp(v) if t.log else v
    if t.integer:
        return min(max(round(v), math.ceil(t.low)), math.floor(t.high))
    return min(max(_short(v), float(t.low)), float(t.high))
