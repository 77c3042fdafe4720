"""What the comparison's command line (and an experiment file's sweep) asks of its runs, read before anything runs.

The comparison runs one setting per method: it chooses the methods and the seeds itself, and every other key has
one value in all its runs. An experiment file written for Hydra's basic sweeper (`hydra.sweeper.params`) sweeps
some keys over several values: its methods and seeds are the comparison's to choose, a key the command line sets
is the command line's, and any other swept key must be fixed on the command line. A tuned key the command line
sets is fixed in every run of the method instead of searched.
"""

# no `from __future__ import annotations`: Hydra's plugin scan runs this module outside sys.modules, where a
# dataclass cannot read string annotations
from dataclasses import dataclass, field

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException

# keys the protocol sets for each run: a user's value would be overwritten
OWNED = ("seed", "eval.split", "eval.held_out_clients", "resume", "overwrite", "hydra.sweep.subdir")
CHOSEN_HERE = ("aggregator", "client/objective", *OWNED)  # an experiment's sweep over these is ignored


def _parse(lines: list[str]) -> list[Override]:
    return OverridesParser.create().parse_overrides(lines)


def _values(override: Override) -> list[str]:
    if not override.is_sweep_override():
        return [override.get_value_element_as_str()]
    try:
        return list(override.sweep_string_iterator())
    except HydraException:  # an interval or a glob: no list of values, but more than one
        return [override.get_value_element_as_str(), "..."]


def _several(key: str, values: list[str]) -> str:
    return f"{', '.join(values)}: the comparison runs one setting; fix one on the command line, e.g. {key}={values[0]}"


@dataclass
class Arguments:
    """The command line read for the comparison: `runs` are the overrides of every run (an experiment's values
    that apply, then the command line's), `keys` the keys the command line sets, `notes` the log lines to show."""

    runs: list[str]
    keys: set[str]
    notes: list[str] = field(default_factory=list)


def read_arguments(arguments: list[str], params: dict | None, experiment: str | None) -> Arguments:
    """The comparison's reading of its command line and of `hydra.sweeper.params`; a ValueError whose one line
    names the key and its values for what it cannot run."""
    try:
        parsed = _parse(list(arguments))
    except HydraException as err:
        raise ValueError(f"{err}".splitlines()[0]) from None
    for o in parsed:
        key = o.key_or_group
        if key in OWNED:
            raise ValueError(f"{o.input_line} is not allowed here: the protocol sets {key} for each of its runs "
                             "(seeds: tune_seeds and confirm_seeds; the folder: hydra.sweep.dir)")
        if o.is_sweep_override():
            raise ValueError(f"{o.input_line} sweeps {key} over {_several(key, _values(o))}")
    keys = {o.key_or_group for o in parsed}
    source = f"+experiment={experiment}" if experiment else "hydra.sweeper.params"
    ignored, runs = [], []
    for o in _parse([f"{k}={v}" for k, v in (params or {}).items()]):
        key, values = o.key_or_group, _values(o)
        if key in CHOSEN_HERE:
            ignored.append(key)
        elif key in keys:
            continue  # the command line's value wins
        elif len(values) > 1:
            raise ValueError(f"{source} sweeps {key} over {_several(key, values)}")
        else:
            runs.append(o.input_line)
    notes = [f"{source} sweeps {', '.join(ignored)}: ignored, the comparison chooses the methods (methods) and the "
             "seeds (tune_seeds, confirm_seeds) itself"] if ignored else []
    return Arguments(runs + list(arguments), keys, notes)
