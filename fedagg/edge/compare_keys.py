"""The comparison's own keys, declared once with their defaults and the line `python -m fedagg.compare --help`
shows for each: the schema of the `fedagg_compare` Hydra sweeper (hydra_plugins/fedagg_compare registers it), read
by the command line's help without Hydra's plugins or Optuna."""

from dataclasses import MISSING, dataclass, field, fields
from typing import Any


def _key(default: Any, line: str, factory=None) -> Any:
    """A protocol key: its default and the line `python -m fedagg.compare --help` shows for it."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": line})
    return field(default=default, metadata={"help": line})


@dataclass
class CompareSweeperConf:
    _target_: str = "hydra_plugins.fedagg_compare.compare_sweeper.CompareSweeper"
    # Any: the protocol checks them itself and says what is wrong in one line
    methods: Any = _key(None, "(required) the methods, e.g. [fedavg,fedprox]: aggregator or client/objective options")
    budget: Any = _key(16, "trials per method, exactly (one when the command line fixes all it would tune)")
    tune_seeds: Any = _key(None, "every trial runs on each seed and scores their mean; [0,1] where the budget allows",
                           lambda: [0])
    confirm_seeds: Any = _key(5, "the confirm runs' fresh seeds: a count (after the largest tuning seed) or a list")
    baseline: Any = _key(None, "the method the paired statistics compare against (null: the first)")
    val_frac: Any = _key(0.1, "each client's validation share while the command line leaves client.val_frac null")
    batch: Any = _key(1, "trials of each method launched together (a parallel launcher runs them at once)")
    sampler_seed: Any = _key(0, "the seed of the trials' Sobol design (trial 0: each method's defaults)")
    validation: Any = _key("split", "split: score on every client's own validation split; clients: on held-out clients")
    held_out: Any = _key(0.2, "with validation=clients: the share of the clients never trained on")
    # an experiment file's sweep for Hydra's basic sweeper: read for the settings it fixes (arguments.py)
    params: Any = None


def protocol_keys() -> dict[str, tuple[Any, str]]:
    """key -> (default, one line) of every protocol key, from CompareSweeperConf."""
    return {f.name: (f.default_factory() if f.default is MISSING else f.default, f.metadata["help"])
            for f in fields(CompareSweeperConf) if "help" in f.metadata}
