"""A method's search space, read from the `Tune` declarations of the constructors its config instantiates.

A method is a config option: an aggregator (`aggregator=NAME`) or a client objective (`client/objective=NAME`).
Its space is every declared `Tune` of the aggregator and client nodes of its composed config (nested nodes
such as a client half included), keyed by the dotted config key a trial overrides (`aggregator.lr`,
`client.objective.mu`, `client.lr`). The client's rate lives on the one client constructor, so every method
searches it over the same range.
"""

from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass

from fedagg.config.constraints import Tune, constraints, tunables

METHOD_GROUPS = ("aggregator", "client")  # the config subtrees whose declared ranges a method's space holds


@dataclass(frozen=True)
class Param:
    key: str  # dotted config key, e.g. "aggregator.tau"
    tune: Tune
    default: object  # the method's YAML value


def _target(path: str):
    module, _, name = path.rpartition(".")
    target = getattr(importlib.import_module(module), name)
    return target.__init__ if inspect.isclass(target) else target


def _walk(node: dict, prefix: str, interpolated: set[str]):
    target = node.get("_target_")
    if target:
        fn = _target(target)
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


def grid(param: Param, points: int) -> list[float]:
    """`points` values spread evenly over the range (in log space for a log range), both ends included."""
    t = param.tune
    if points == 1:
        return [math.sqrt(t.low * t.high) if t.log else (t.low + t.high) / 2]
    lo, hi = (math.log(t.low), math.log(t.high)) if t.log else (t.low, t.high)
    values = [lo + (hi - lo) * i / (points - 1) for i in range(points)]
    return [float(f"{math.exp(v) if t.log else v:.6g}") for v in values]  # short, exact in the override strings
