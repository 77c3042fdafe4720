"""One line for a command line Hydra cannot compose because of a mistyped group option or key."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep
from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

from fedagg.edge import CONF
from fedagg.config.schema import META_KEYS, check_node, own_group


def _option_line(group: str, value: str, options: list[str], listed: str | None = None) -> str:
    """One line for an option the group does not have; `listed`: the list it was named in (`channel=[topk,zip]`)."""
    lowered = {o.lower(): o for o in options}
    close = [lowered[value.lower()]] if value.lower() in lowered else difflib.get_close_matches(value, options, n=1)
    own = "" if close else own_option(group, value)  # no typo of a shipped one: perhaps the user's own
    if listed is not None:
        hint = f"; did you mean {close[0]}?" if close else ""
        return f"{listed} is not allowed: {value} is not a {group} option{hint} (options: {', '.join(options)}){own}"
    hint = f"; did you mean {group}={close[0]}?" if close else ""
    return f"{group}={value} is not an option{hint} (options: {', '.join(options)}){own}"


def own_option(group: str, value: str) -> str:
    """What an option of the user's own needs to be found: its YAML in their folder, and that folder searched."""
    return (f"; an option of your own needs its folder searched: {group}/{value}.yaml in DIR and "
            "hydra.searchpath=[file://DIR] on the command line")


def _named(value) -> list[str]:
    """The option names a group override's value (or one value of a sweep) gives: one, or a list's."""
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _shown(group: str, value) -> str:
    return f"{group}=[{','.join(_named(value))}]" if isinstance(value, list) else f"{group}={value}"


def _sweep_values(o) -> list:
    """A sweep override's values, each a name or a list of names (`channel=none,[topk,dp]`)."""
    value = o.value()
    return list(value.list) if isinstance(value, ChoiceSweep) else list(o.sweep_string_iterator())


def _keys(node, prefix: str = "") -> set[str]:
    """Every key path of a config node, values unresolved (an option's YAML as written)."""
    out = set()
    for key in node.keys() if isinstance(node, DictConfig) else ():
        out.add(f"{prefix}{key}")
        out |= _keys(node._get_node(key), f"{prefix}{key}.")
    return out


def _unknown_key_line(loader, parsed: list, lines: list[str], failing: str, multirun: bool) -> str | None:
    """One line for the override `failing` (of the composed `lines`), whose key the config does not have: which
    options of its group have it, `++key=value` where a sweep sets it before picking the option, else the
    nearest known key."""
    key, value = failing.split("=", 1)
    typed = next((o.input_line for o in parsed if o.key_or_group == key), failing)  # a sweep's values, not one job's
    value = typed.split("=", 1)[1]
    if moved := own_group(key):  # model.adapter=lora, as other tools write it
        return (f"{typed} is not allowed: {moved[0]} is a group of its own, beside {key.split('.')[0].split('/')[0]}; "
                f"write {moved[1]}={value}")
    try:  # the config as it would be without that override: the group options it chose
        base = compose(config_name="config", overrides=[line for line in lines if line != failing],
                       return_hydra_config=True)
    except HydraException:
        return None  # another problem first: Hydra names it
    parts = key.split(".")
    groups = [g for g in ("/".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)) if loader.repository.group_exists(g)]
    known = {k for k in _keys(base) if not k.startswith("hydra")}
    known |= {g for g, c in base.hydra.runtime.choices.items() if c is None and "/" not in g}  # model: null
    owners: dict[str, list[str]] = {}  # key path -> the options of its group that have it
    if groups:
        group = groups[0]
        dotted, chosen = group.replace("/", "."), base.hydra.runtime.choices.get(group)
        for option in loader.get_group_options(group):
            loaded = loader.repository.load_config(f"{group}/{option}")
            for k in _keys(loaded.config if loaded is not None else None, f"{dotted}."):
                owners.setdefault(k, []).append(option)
        have, name = owners.get(key, []), key[len(dotted) + 1:]
        swept = next((list(o.sweep_string_iterator()) for o in parsed if o.is_sweep_override()
                      and o.key_or_group == group), None) if multirun else None
        if have and swept and set(swept) <= set(have):
            return (f"{typed} is applied before the sweep picks the {dotted}, to {group}={chosen}, which has no "
                    f"{name}: write ++{typed} to set it in every job")
        if have and chosen is None and not swept:  # model: null, the dataset's default_model filled in after composing
            return (f"{typed} is not allowed without {group}=NAME: no {dotted} is chosen here (a dataset's default "
                    f"backbone is chosen after the command line is read); name it, e.g. {group}={have[0]} {typed} "
                    f"({group}={', '.join(have)} {'has' if len(have) == 1 else 'have'} {name})")
        if have:
            lacking = [o for o in swept or [chosen] if o not in have]
            return (f"{typed} is not allowed: {group}={', '.join(lacking)} has no {name}; "
                    f"{group}={', '.join(have)} {'has' if len(have) == 1 else 'have'} it")
    parent, _, last = key.rpartition(".")
    tiers = ([k for k in known if k.rpartition(".")[0] == parent],  # the chosen option's keys, then its group's
             [k for k in owners if k.rpartition(".")[0] == parent], sorted(known | set(owners)))
    for tier, cutoff in zip(tiers, (0.6, 0.6, 0.8)):
        lasts = {k.rpartition(".")[2]: k for k in tier if k.rpartition(".")[2] not in META_KEYS}
        if close := difflib.get_close_matches(last, list(lasts), n=1, cutoff=cutoff):
            near = lasts[close[0]]
            break
    else:
        shown = ", ".join(sorted(k.rpartition(".")[2] for k in tiers[0] if k.rpartition(".")[2] not in META_KEYS))
        return (f"{key} is not a setting fedagg knows (known keys{' of ' + parent if parent else ''}: "
                f"{shown or 'none'}); remove it or correct its name")
    where = ""
    if near not in known:
        have = owners[near]
        where = (f" ({groups[0]}={', '.join(have)} {'has' if len(have) == 1 else 'have'} it, "
                 f"{groups[0]}={base.hydra.runtime.choices.get(groups[0])} does not)")
    return f"{key} is not a setting fedagg knows; did you mean {near}={value}?{where}"


_composed: dict[tuple[str, ...], DictConfig] = {}  # one command line's configs, composed once each


def _compose(lines: list[str]) -> DictConfig:
    if tuple(lines) not in _composed:
        _composed[tuple(lines)] = compose(config_name="config", overrides=lines, return_hydra_config=True)
    return _composed[tuple(lines)]


def _composition_problem(loader, parsed: list, lines: list[str], multirun: bool) -> str | None:
    """One line for why the overrides `lines` do not compose, or None when they do (or Hydra says it better)."""
    try:
        _compose(lines)
    except MissingConfigException as err:
        for line in lines:
            try:
                (o,) = OverridesParser.create().parse_overrides([line])
                value = o.value()
            except (HydraException, ValueError):
                continue
            for name in _named(value) if not o.is_sweep_override() else []:
                if f"{o.key_or_group}/{name}" == err.missing_cfg_file:
                    listed = _shown(o.key_or_group, value) if isinstance(value, list) else None
                    options = list(err.options or []) or loader.get_group_options(o.key_or_group)
                    return _option_line(o.key_or_group, name, options, listed)
    except ConfigCompositionException as err:
        if found := re.match(r"Could not append to config. An item is already at '([^']+)'", str(err)):
            line = next((line for line in lines if line.startswith(f"+{found.group(1)}=")), None)
            return None if line is None else f"{line} adds a key the config already has: write {line[1:]} to change it"
        if found := re.match(r"Could not override '([^']+)'", str(err)):
            line = next((line for line in lines if line.startswith(f"{found.group(1)}=")), None)
            return None if line is None else _unknown_key_line(loader, parsed, lines, line, multirun)
    return None


def explain_composition_error(argv: list[str]) -> str | None:
    """One line for a command line Hydra cannot compose because of a mistyped group option or key, or None.

    Hydra's own messages span many lines, suggest no near option, and in a sweep suggest `+key` where
    `++key` is what works. This composes the config as Hydra is about to: a sweep's first config without
    its swept values, then its first job, and checks each swept option of a group. Anything else (flags
    such as --cfg, syntax errors, what only a later job would show) is left to Hydra.
    """
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return None
    multirun = any(a in ("-m", "--multirun") for a in argv)
    try:
        parsed = OverridesParser.create().parse_overrides([a for a in argv if not a.startswith("-")])
    except HydraException:
        return None
    sweeps = [o for o in parsed if multirun and o.is_sweep_override()]
    first = [o.input_line for o in parsed if o not in sweeps]
    _composed.clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        if problem := _composition_problem(loader, parsed, first, multirun):
            return problem
        for o in (o for o in sweeps if loader.repository.group_exists(o.key_or_group)):  # composed job by job
            options = loader.get_group_options(o.key_or_group, config_name="config", overrides=first)
            for value in _sweep_values(o):
                for name in _named(value):
                    if name not in options:
                        listed = _shown(o.key_or_group, value) if isinstance(value, list) else None
                        return _option_line(o.key_or_group, name, options, listed)
                    loaded = loader.repository.load_config(f"{o.key_or_group}/{name}")
                    dotted = o.key_or_group.replace("/", ".")
                    for add in (a for a in parsed if a.is_add() and a.key_or_group.startswith(f"{dotted}.")):
                        if add.key_or_group in _keys(loaded.config if loaded else None, f"{dotted}."):
                            return (f"{add.input_line} adds a key that {o.key_or_group}={name} already has, which "
                                    f"Hydra refuses in that job: write +{add.input_line} to add or set it in every job")
        if sweeps:
            job = first + [f"{o.get_key_element()}={next(o.sweep_string_iterator())}" for o in sweeps]
            if problem := _composition_problem(loader, parsed, job, multirun):
                return problem
        return _output_problem(job if sweeps else first, multirun)


def _output_problem(lines: list[str], multirun: bool) -> str | None:
    """One line for where the results would go that Hydra cannot use (a folder that is a file) or a launcher
    setting its constructor does not take, or None."""
    try:
        cfg = _compose(lines)
    except HydraException:
        return None
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        folder = Path(str(OmegaConf.select(cfg, key)))
    except Exception:  # noqa: BLE001 - ${now:...} and the like resolve only inside Hydra's app: left to it
        folder = None
    if folder is not None:
        blocking = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            what = "is a file" if blocking == folder else f"is inside {blocking}, a file"
            return f"{key}={folder} is not allowed: it {what}, not a folder; give a folder for the results"
    launcher = cfg.hydra.get("launcher")
    if multirun and isinstance(launcher, DictConfig) and "_target_" in launcher:
        try:
            check_node(launcher, "hydra.launcher.")
        except ValueError as err:
            return str(err)
        except Exception:  # noqa: BLE001 - a launcher that does not load here is Hydra's to report
            return None
    return None


def in_user_words(message: str, overrides: list[str]) -> str:
    """`message` with each `key=value` of a number the user typed as they typed it (`1e300`, not `1e+300`)."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return message
    for o in parsed:
        typed = o.input_line.split("=", 1)[1] if "=" in o.input_line else None
        value = o.value() if not o.is_sweep_override() else None
        if typed is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        for shown in {repr(value), repr(float(value))}:
            message = message.replace(f"{o.key_or_group}={shown} ", f"{o.key_or_group}={typed} ")
    return message
