"""The checks of a job's configuration at the Hydra edge, before any data is loaded: keys, types and ranges, an
experiment's choices, the parts instantiated and wired together. `fedagg.run` makes them first thing in a run;
`check_run` makes them for a caller that launches runs later and must not find out at the first one
(`fedagg.compare`). A refusal is a `SetupError` whose one line names the key, the value and what is allowed."""

from __future__ import annotations

import copy
import functools
import re

from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import InterpolationKeyError

from fedagg.edge.channel_choice import uniform_mean_for_privacy
from fedagg.edge.default_model import with_default_model
from fedagg.loop.assembly import Parts, connect
from fedagg.config.schema import check_config
from fedagg.config.settings import Settings
from fedagg.loop.splits import scaled_rounds
from fedagg.results.groups import GROUPS, RECORDED_CHOICES


class SetupError(ValueError):
    """The configuration or the data cannot make a run; the message says which key and why."""


class FolderHeld(SetupError):
    """The run folder holds another run (or one that resume=true cannot continue with this configuration)."""


def settings_from(cfg: DictConfig) -> Settings:
    keys = ("seed", "num_clients", "clients_per_round", "eval_every", "target_acc", "stop_at_target", "checkpoint_every")
    scale = cfg.experiment_scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 1:
        raise ValueError(f"experiment_scale={scale!r} is not allowed; it must be a fraction in (0, 1]")
    rounds = scaled_rounds(cfg.rounds, scale) if isinstance(cfg.rounds, int) and cfg.rounds >= 1 else cfg.rounds
    return Settings(rounds=rounds, eval_per_client=cfg.eval.per_client, eval_split=cfg.eval.split,
                    held_out=cfg.eval.held_out_clients, **{k: cfg[k] for k in keys})


def user_error_of(err: Exception) -> Exception | None:
    """The error to show a user (a constructor's own message), or None for a bug."""
    cause = err.__cause__ if isinstance(err, InstantiationException) else err
    return cause if isinstance(cause, (ValueError, FileNotFoundError)) else None


def check_no_ignored_choice(cfg: DictConfig, choices: dict | None) -> None:
    """Refuse a group chosen on the command line that the experiment file replaces.

    A table whose rows or columns are not plain group options sets, e.g.,
    `aggregator: ${table.methods.${method}.aggregator}`: a user's `aggregator=fedavg` would
    then be silently ignored and another cell run. Name the key that picks it instead.
    """
    experiment = (choices or {}).get("experiment")
    for group, chosen in (choices or {}).items():
        parent_path, _, key = group.replace("/", ".").rpartition(".")
        parent = OmegaConf.select(cfg, parent_path) if parent_path else cfg
        if chosen is None or group == "experiment" or not isinstance(parent, DictConfig) or key not in parent:
            continue
        if not OmegaConf.is_interpolation(parent, key):
            continue
        source = str(parent._get_node(key)._value())
        if f"hydra:runtime.choices.{group}" in source:
            continue  # the file maps the chosen option (e.g. model=cnn -> its settings): the choice is used
        pickers = []
        for name in dict.fromkeys(re.findall(r"\$\{(\w+)\}", source)):
            container = re.search(rf"([\w.]+)\.\$\{{{name}\}}", source)
            options = OmegaConf.select(cfg, container.group(1)) if container else None
            allowed = f"; one of {', '.join(map(str, options))}" if isinstance(options, DictConfig) else ""
            pickers.append(f"{name} (now {name}={cfg.get(name)}{allowed})")
        pickers += [f"the {g} chosen (now {g}={choices.get(g)})"
                    for g in dict.fromkeys(re.findall(r"hydra:runtime\.choices\.([\w/]+)", source))]
        raise ValueError(f"{group}={chosen} is ignored by +experiment={experiment}: it sets the {group} from "
                         f"{' and '.join(pickers) or source}; pick the cell with those keys instead")


def _leaves(node, path: str = ""):
    """(dotted key, raw value) of every leaf of a plain container, interpolations unresolved."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif not isinstance(node, list):
        yield path, node


def explain_missing_option(cfg: DictConfig, err: InterpolationKeyError, choices: dict) -> str:
    """One line for an experiment key that picks an option its file does not define
    (`method=nope` makes `${table.methods.${method}...}` point nowhere)."""
    found = re.search(r"Interpolation key '([\w.]+)' not found", str(err))
    if not found:
        return str(err)
    path = found.group(1).split(".")
    for depth in range(len(path) - 1, 0, -1):
        parent = OmegaConf.select(cfg, ".".join(path[:depth]), throw_on_resolution_failure=False)
        if isinstance(parent, DictConfig):
            break
    else:
        return str(err)
    missing, options = path[depth], ", ".join(map(str, parent.keys()))
    # the key holding that value picked it: a top-level one (method=...) before table.* (table.profile=...),
    # then a group chosen on the command line (dataset=cifar10)
    held = [k for k, v in _leaves(OmegaConf.to_container(cfg, resolve=False)) if str(v) == missing and not k.startswith("hydra.")]
    pickers = sorted(held, key=lambda k: k.startswith("table.")) + [g for g, c in choices.items() if str(c) == missing]
    if pickers:
        return f"{pickers[0]}={missing!r} is not allowed here; choose one of {options}"
    return f"{err.full_key} cannot be set: {'.'.join(path[:depth])} has no {missing!r} (it has {options})"


def checked_settings(cfg: DictConfig, choices: dict) -> Settings:
    """The checks of a configuration that need neither its parts nor the device: keys, types, ranges, settings."""
    check_no_ignored_choice(cfg, choices)
    check_config(cfg, GROUPS)
    return settings_from(cfg)


def instantiate_parts(cfg: DictConfig, choices: dict) -> Parts:
    parts = Parts(**{group: instantiate(cfg[group], _convert_="all") for group in GROUPS},  # plain lists and dicts
                  noise=cfg.partition.get("noise", 0.0), choices=choices)
    if "noise" in parts.partition.keywords:  # read by the run, which adds it to the images, not by the split
        parts.partition = functools.partial(parts.partition.func, *parts.partition.args,
                                            **{k: v for k, v in parts.partition.keywords.items() if k != "noise"})
    return parts


def check_run(cfg: DictConfig, parts: bool = True) -> None:
    """Refuse (SetupError, one line) a job's configuration, composed with its `hydra` node, that its run would
    refuse before loading any data: the checks a run makes first and, with `parts`, those of its instantiated parts
    wired together (`connect`: a method and the client or engine it cannot run with, a validation split that holds
    nothing out). For a caller that launches runs later and must not find out at the first one (fedagg.compare).
    `parts=False` where the runs go to other machines: an engine's choice and checks follow the device there."""
    hydra_config = HydraConfig.instance()
    previous = hydra_config.cfg
    hydra_config.set_config(cfg)  # `${hydra:runtime.choices...}` in experiment files resolves as in the job
    try:
        choices = {k: v for k, v in cfg.hydra.runtime.choices.items() if k in RECORDED_CHOICES}
        overrides = list(cfg.hydra.overrides.task)
        cfg = copy.deepcopy(cfg)
        with open_dict(cfg):
            del cfg["hydra"]
        cfg, _ = with_default_model(cfg, choices)
        cfg, _ = uniform_mean_for_privacy(cfg, overrides)  # as the job will run it
        OmegaConf.to_container(cfg, resolve=True)
        settings = checked_settings(cfg, choices)
        if parts and settings.num_clients is not None:  # else known only once the data is loaded
            connect(instantiate_parts(cfg, choices), settings)
    except SetupError:
        raise
    except InterpolationKeyError as err:
        raise SetupError(explain_missing_option(cfg, err, choices)) from None
    except Exception as err:
        if (user_error := user_error_of(err)) is not None:
            raise SetupError(str(user_error)) from None
        raise
    finally:
        hydra_config.cfg = previous
