"""Ranges and choices of a setting, declared once, in the signature of the constructor that takes it.

A parameter states what it accepts in its annotation:

    beta: Annotated[float, Range(ge=0, lt=0.5)] = 0.1
    evaluate: Literal["last_two", "global"] = "last_two"

Two readers enforce it with the same one-line message: `fedagg.config.schema` on the composed
config, before anything is built, and `@checked(prefix)` on the constructor, for an object
built from Python (a test, a notebook). The message is `<prefix><key>=<value> is not allowed;
<allowed>`; `allowed` is written out from the range unless the declaration gives its own words.
"""

from __future__ import annotations

import functools
import inspect
import math
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

_INF = math.inf


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _show(bound: float) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


class Constraint:
    """What a setting accepts: `accepts(value)`, and `allowed`, the words after "is not allowed; "."""

    allowed: str = ""

    def accepts(self, value) -> bool:
        raise NotImplementedError

    def shown(self, value):
        """The value as the message shows it."""
        return value


@dataclass(frozen=True)
class Range(Constraint):
    """A number (never a boolean) within the given bounds; `integer`: an int; `finite`: not ±inf (NaN never
    passes a bound); `also`: further values accepted as they are (e.g. "auto")."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    integer: bool = False
    finite: bool = False
    also: tuple = ()
    words: str | None = None  # the message's own words, when the generated ones say too little

    def accepts(self, value) -> bool:
        if any(value == a and type(value) is type(a) for a in self.also):
            return True
        if not _number(value) or (self.integer and not isinstance(value, int)):
            return False
        if self.finite and not math.isfinite(value):
            return False
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt)
                and value == value)

    @property
    def allowed(self) -> str:
        if self.words is not None:
            return self.words
        kind = "an integer" if self.integer else ("a finite number" if self.finite else "a number")
        low = f"[{_show(self.ge)}" if self.ge is not None else (f"({_show(self.gt)}" if self.gt is not None else None)
        high = f"{_show(self.le)}]" if self.le is not None else (f"{_show(self.lt)})" if self.lt is not None else None)
        if low and high:
            return f"it must be {kind} in {low}, {high}"
        if low:
            return f"it must be {kind} {'>=' if self.ge is not None else '>'} {low[1:]}"
        if high:
            return f"it must be {kind} {'<=' if self.le is not None else '<'} {high[:-1]}"
        return f"it must be {kind}"


@dataclass(frozen=True)
class Items(Constraint):
    """A list (any sequence but a string: a tuple, an OmegaConf list) whose every item the `each` range accepts;
    `length`: exactly that many items."""

    each: Range
    length: int | None = None
    words: str | None = None

    def accepts(self, value) -> bool:
        if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
            return False
        if self.length is not None and len(value) != self.length:
            return False
        return all(self.each.accepts(v) for v in value)

    @property
    def allowed(self) -> str:
        if self.words is not None:
            return self.words
        count = f"{self.length} items" if self.length is not None else "a list"
        return f"{count}, each: {self.each.allowed.removeprefix('it must be ')}"


@dataclass(frozen=True)
class Flag(Constraint):
    """true or false (a number or a string is not)."""

    words: str = "it must be true or false"

    def accepts(self, value) -> bool:
        return isinstance(value, bool)

    @property
    def allowed(self) -> str:
        return self.words


@dataclass(frozen=True)
class OneOf(Constraint):
    """One of the names of a `Literal[...]` annotation."""

    choices: tuple
    words: str | None = None  # the message's own words, e.g. what each choice means

    def accepts(self, value) -> bool:
        return any(value == c and type(value) is type(c) for c in self.choices)

    @property
    def allowed(self) -> str:
        return self.words if self.words is not None else f"choose one of {', '.join(map(str, self.choices))}"


def _without_none(hint) -> tuple[object, bool]:
    """(the annotation with None taken out of a union, whether None was in it)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(rest) < len(args):
            return rest[0], True
    return hint, False


def _constraint(hint) -> tuple[Constraint | None, bool]:
    """(the constraint an annotation declares, whether it also admits None)."""
    hint, nullable = _without_none(hint)
    if typing.get_origin(hint) is typing.Annotated:
        nullable = nullable or _without_none(typing.get_args(hint)[0])[1]
        found = [a for a in hint.__metadata__ if isinstance(a, Constraint)]
        return (found[0] if found else None), nullable
    if typing.get_origin(hint) is typing.Literal:
        return OneOf(typing.get_args(hint)), nullable
    return None, nullable


def constraints(function: Callable) -> dict[str, tuple[Constraint, bool]]:
    """name -> (constraint, None admitted) for every parameter of `function` that declares one."""
    hints = typing.get_type_hints(function, include_extras=True)
    found = {name: _constraint(hint) for name, hint in hints.items() if name != "return"}
    return {name: (c, nullable) for name, (c, nullable) in found.items() if c is not None}


def typed(value) -> str:
    """A value as the user writes it on the command line or in YAML: null, true, false; others as Python shows them."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def refusal(prefix: str, name: str, value, constraint: Constraint) -> ValueError:
    return ValueError(f"{prefix}{name}={typed(constraint.shown(value))} is not allowed; {constraint.allowed}")


def check(prefix: str, declared: dict[str, tuple[Constraint, bool]], values: dict[str, Any]) -> None:
    """Refuse the first value its parameter's constraint does not accept."""
    for name, (constraint, nullable) in declared.items():
        if name not in values:
            continue
        value = values[name]
        if value is None and nullable:
            continue
        if not constraint.accepts(value):
            raise refusal(prefix, name, value, constraint)


def checked(prefix: str) -> Callable:
    """Decorate a constructor so that, called from Python, it refuses what its annotations do not allow,
    in the words the config check uses; `prefix` is where its settings live (e.g. "aggregator.")."""

    def wrap(init: Callable) -> Callable:
        signature = inspect.signature(init)
        declared: dict | None = None

        @functools.wraps(init)
        def checked_init(*args, **kwargs):
            nonlocal declared
            if declared is None:  # the annotations may name classes defined after the decorator ran
                declared = constraints(init)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            check(prefix, declared, bound.arguments)
            return init(*args, **kwargs)

        return checked_init

    return wrap


@dataclass(frozen=True)
class Tune:
    """The range a tuner searches for a parameter, declared beside its constraint:

        mu: Annotated[float, Range(ge=0), Tune(1e-3, 1, log=True, source="Li et al. 2020 grid")] = 0.01

    `log`: sampled uniformly in log space (then low must be > 0); `integer`: whole numbers;
    `source`: where the range comes from (the paper's grid, else why), shown in the comparison report."""

    low: float
    high: float
    log: bool = False
    integer: bool = False
    source: str = ""

    def problem(self) -> str | None:
        """Why the range cannot be searched, or None."""
        if not (_number(self.low) and _number(self.high)) or not (math.isfinite(self.low) and math.isfinite(self.high)):
            return f"its range [{self.low}, {self.high}] must be two finite numbers"
        if self.low >= self.high:
            return f"its range [{_show(self.low)}, {_show(self.high)}] is empty: low must be below high"
        if self.log and self.low <= 0:
            return f"its log range [{_show(self.low)}, {_show(self.high)}] must be positive"
        if self.integer and int(self.low) == int(self.high) and self.low != int(self.low):
            return f"its integer range [{_show(self.low)}, {_show(self.high)}] holds no integer"
        return None

    def at_edge(self, value: float, share: float = 0.05) -> bool:
        """Whether `value` lies within `share` of the range (in its own scale) of an end: the best may lie beyond."""
        scale = math.log if self.log else (lambda v: v)
        low, high, v = scale(self.low), scale(self.high), scale(value)
        return v <= low + share * (high - low) or v >= high - share * (high - low)


def tunables(function: Callable) -> dict[str, Tune]:
    """name -> Tune for every parameter of `function` that declares a search range."""
    hints = typing.get_type_hints(function, include_extras=True)
    found = {}
    for name, hint in hints.items():
        hint, _ = _without_none(hint)
        if typing.get_origin(hint) is typing.Annotated:
            tunes = [a for a in hint.__metadata__ if isinstance(a, Tune)]
            if tunes:
                found[name] = tunes[-1]  # the outermost declaration wins (a class may narrow a shared one)
    return found
