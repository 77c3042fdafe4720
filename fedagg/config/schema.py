"""The configuration's types and known keys, checked before anything is built.

The top-level keys have a typed schema (`TopLevel`); every group option is typed by the
constructor (or function) its `_target_` names: its parameters are the keys it accepts and
their annotations the types. OmegaConf's own validation does the typing (a boolean is not
an integer, "abc" is not a float), and fedagg turns its errors, an unknown key (with the
nearest known one) and a non-finite number into one line naming the key, the value and
what is allowed. The ranges and choices a parameter declares in its annotation
(`fedagg.config.constraints`: `Annotated[float, Range(...)]`, `Literal[...]`) are checked here
too, in the words its constructor would use. A top-level key is known when fedagg reads it, when another setting
interpolates it (a table's `method`), or when it is the table layout the scripts read.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
import re
import types
import typing
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ValidationError

from fedagg.config.constraints import check, constraints, typed
from fedagg.config.names import DISPLAY_NAME, takes_display_name
from fedagg.runtime import threads

META_KEYS = ("_target_", "_partial_", "_recursive_", "_convert_", "_args_")
READ_BY_SCRIPTS = ("table",)  # a table experiment's layout, read by make_table and plot from summary.json
# keys every option of a group takes, read by the run rather than by the option's target
SHARED_KEYS = {"partition": {"noise": float}}  # NIID-Bench feature noise on any split (fedagg.data.device)


@dataclass
class DataKeys:
    root: str = MISSING
    download: bool = MISSING


@dataclass
class EvalKeys:
    per_client: bool = MISSING
    split: str = MISSING  # test | val: checked by Settings
    held_out_clients: float = MISSING


@dataclass
class TopLevel:
    seed: int = MISSING
    rounds: int = MISSING
    num_clients: Optional[int] = MISSING  # null: all of a federated dataset's own clients
    clients_per_round: Optional[int] = MISSING
    device: str = MISSING
    eval_every: int = MISSING
    target_acc: Optional[float] = MISSING
    stop_at_target: bool = MISSING
    checkpoint_every: int = MISSING
    resume: bool = MISSING
    overwrite: bool = MISSING
    deterministic: bool = MISSING
    tf32: bool = MISSING
    experiment_scale: float = MISSING
    threads: Any = MISSING  # "auto" or a number: checked by fedagg.runtime.threads
    data: DataKeys = field(default_factory=DataKeys)
    eval: EvalKeys = field(default_factory=EvalKeys)


def _type_name(hint) -> str:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if typing.get_origin(hint) is typing.Union:
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return f"{_type_name(inner[0])} or null"
    return names.get(hint, str(hint))


def _omegaconf_type(hint):
    """The annotation as OmegaConf can enforce it: a primitive, Optional of one, else Any (checked by the code)."""
    if hint in (int, float, bool, str):
        return hint
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and rest[0] in (int, float, bool, str):
            return Optional[rest[0]]
    return Any


def _refuse_type(prefix: str, err: ValidationError, values: DictConfig, schema) -> ValueError:
    key = str(err.full_key)
    value = OmegaConf.select(values, key, throw_on_missing=False)
    hint = _field_hint(schema, key)
    return ValueError(f"{prefix}{key}={_shown(value)} is not allowed; it must be {_type_name(hint)}")


def _field_hint(schema, dotted: str):
    node = schema
    for part in dotted.split("."):
        hints = typing.get_type_hints(node)
        node = hints.get(part, Any)
    return node


def _shown(value) -> str:
    if isinstance(value, (DictConfig, ListConfig)):
        return str(OmegaConf.to_container(value))
    return typed(value)


# keys spelled inside a group's node that are a group of their own here: adapters are chosen beside the model
# (the config's `adapter`), since the model may be left to the dataset (model: null); `model.adapter=lora`, the
# design's and other tools' spelling, is read as `adapter=lora` on the command line and in run_experiment
OWN_GROUPS = {"model.adapter": "adapter"}


def respelled(overrides: list[str]) -> list[str]:
    """`overrides` with each key spelled inside another group's node written as its own group's
    (`model.adapter=lora` -> `adapter=lora`, `+model.adapter.rank=8` -> `adapter.rank=8`); the rest as given."""
    out = []
    for line in overrides:
        key, eq, value = line.partition("=")
        moved = own_group(key) if eq and not key.startswith("~") else None
        out.append(f"{moved[1]}={value}" if moved else line)
    return out


def own_group(key: str) -> tuple[str, str] | None:
    """(the group, the key as it is written here) for a key spelled inside another group (`model.adapter.rank` ->
    ("adapter", "adapter.rank")); None for any other key."""
    bare = key.lstrip("+").replace("/", ".")
    for inside, group in OWN_GROUPS.items():
        if bare == inside or bare.startswith(f"{inside}."):
            return group, group + bare[len(inside):]
    return None


def _unknown(prefix: str, key: str, known: list[str], elsewhere: list[str] = ()) -> ValueError:
    """One line for an unknown key, suggesting the nearest known one here, else the nearest full key elsewhere."""
    if moved := own_group(f"{prefix}{key}"):
        return ValueError(f"{prefix}{key} is not a setting fedagg knows: {moved[0]} is a group of its own, beside "
                          f"{prefix.split('.')[0]}; write {moved[1]}=... (e.g. {moved[0]}=lora)")
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        hint = f"did you mean {prefix}{close[0]}?"
    else:
        leaves = {path.rsplit(".", 1)[-1]: path for path in elsewhere}
        near = difflib.get_close_matches(key, list(leaves), n=1, cutoff=0.8)
        hint = f"did you mean {leaves[near[0]]}?" if near else f"known keys: {', '.join(sorted(known))}"
    return ValueError(f"{prefix}{key} is not a setting fedagg knows ({hint}); remove it or correct its name")


def _paths(cfg: DictConfig, prefix: str = "") -> list[str]:
    """Every key path below `cfg` (for suggestions)."""
    out = []
    for key in cfg:
        node = cfg._get_node(key)
        out.append(f"{prefix}{key}")
        if isinstance(node, DictConfig) and not OmegaConf.is_interpolation(cfg, key):
            out += _paths(node, f"{prefix}{key}.")
    return out


def _finite(prefix: str, values: dict, floats: list[str]) -> None:
    for key in floats:
        value = values.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{prefix}{key}={value!r} is not allowed; it must be a finite number")


def locate(path: str, key: str = "_target_"):
    """The class or function `path` names; a module Python cannot import is one line naming `key`."""
    module, _, name = path.rpartition(".")
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as err:  # the user's own module, not on the path: one line, not Python's traceback
        if err.name is not None and (module == err.name or module.startswith(f"{err.name}.")):
            raise ValueError(f"{key}={path} cannot be imported: Python finds no module {err.name!r}; run from the "
                             f"folder that holds {err.name.split('.')[0]}/ with PYTHONPATH=. (or add that folder to "
                             "PYTHONPATH)") from None
        raise ValueError(f"{key}={path} cannot be imported: its module imports {err.name!r}, which is not "
                         "installed") from None
    return getattr(found, name)


def check_node(node: DictConfig, prefix: str, shared: dict | None = None) -> None:
    """A group option: its keys are its target's parameters, typed by their annotations; nested options too.
    `shared`: keys (and their types) the run reads from any option of the group."""
    target = locate(node["_target_"], f"{prefix}_target_")
    function = target.__init__ if inspect.isclass(target) else target
    params = {n: p for n, p in inspect.signature(function).parameters.items() if n != "self"}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        # it takes any keyword (the channel takes its stages by name): only the options inside it can be checked
        for key in node:
            if key not in META_KEYS and isinstance(node._get_node(key), DictConfig) and "_target_" in node[key]:
                check_node(node[key], f"{prefix}{key}.")
        return
    try:
        hints, declared = typing.get_type_hints(function), constraints(function)
    except (NameError, TypeError):  # an annotation that names what only a type checker imports: check no types
        hints, declared = {}, {}
    params = {**dict.fromkeys(shared or ()), **params}
    hints = {**(shared or {}), **hints}
    plain = {}
    for key in node:
        if key in META_KEYS or (key == DISPLAY_NAME and takes_display_name(target)):
            continue
        if key not in params:
            raise _unknown(prefix, key, [p for p in params if p not in ("args", "kwargs")])
        # an interpolation is checked as what it resolves to: `${oc.select:...}` may choose a whole node (an
        # experiment's per-method client objective), whose own ${...} resolve only where it stands in the config
        value = node[key] if OmegaConf.is_interpolation(node, key) else node._get_node(key)
        if isinstance(value, DictConfig) and "_target_" in value:
            check_node(node[key], f"{prefix}{key}.")
        else:
            plain[key] = hints.get(key, Any)
    schema = make_dataclass("Schema", [(k, _omegaconf_type(h), field(default=MISSING)) for k, h in plain.items()])
    values = OmegaConf.create({k: node[k] for k in plain})
    try:
        typed = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(schema), values))
    except ValidationError as err:
        raise _refuse_type(prefix, err, values, schema) from None
    _finite(prefix, typed, [k for k, h in plain.items() if _omegaconf_type(h) in (float, Optional[float])])
    check(prefix, declared, OmegaConf.to_container(values, resolve=True))  # the values as the constructor gets them


def _interpolated(cfg: DictConfig) -> set[str]:
    """Top-level names that some value refers to with ${name...}."""
    text = OmegaConf.to_yaml(cfg, resolve=False)
    return set(re.findall(r"\$\{([A-Za-z_]\w*)", text))


def check_config(cfg: DictConfig, groups: tuple[str, ...]) -> None:
    """Refuse, in one line, a value of the wrong type, a non-finite number or a key nobody reads."""
    top = [f.name for f in TopLevel.__dataclass_fields__.values()]
    known = set(top) | set(groups) | set(READ_BY_SCRIPTS) | {"hydra"}
    used = _interpolated(cfg)
    for key in cfg:
        if key not in known and key not in used:
            raise _unknown("", key, sorted(known - {"hydra"}), [p for g in groups for p in _paths(cfg[g], f"{g}.")])
    for key, schema in (("data", DataKeys), ("eval", EvalKeys)):
        allowed = [f.name for f in fields(schema)]
        extra = sorted(set(cfg[key]) - set(allowed))
        if extra:
            raise _unknown(f"{key}.", extra[0], allowed)
    values = OmegaConf.create({k: cfg[k] for k in top})
    try:
        OmegaConf.merge(OmegaConf.structured(TopLevel), values)
    except ValidationError as err:
        raise _refuse_type("", err, values, TopLevel) from None
    _finite("", {k: values[k] for k in ("target_acc", "experiment_scale")}, ["target_acc", "experiment_scale"])
    threads.choose(cfg.threads, 0, 1)  # auto or a positive number
    for group in groups:
        if group == "model" and cfg.get("model") is None:
            continue  # model: null, the dataset's default_model, filled in by the edge before a run
        if group not in cfg:  # an empty list of options composes to nothing
            hint = "channel=none for no stage, or stages in a list, e.g. channel=[topk,dp]" if group == "channel" \
                else f"one option, {group}=NAME"
            raise ValueError(f"{group}=[] is not allowed; an empty list chooses no {group} option: choose {hint}")
        check_node(cfg[group], f"{group}.", SHARED_KEYS.get(group))
