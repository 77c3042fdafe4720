"""fedagg: simulate federated learning on one device and compare aggregation rules.

The public API: `Aggregator` (FedAvg semantics; a method overrides one step) and the
`AggregateResult` its `aggregate` returns, the
`RoundInputs` it receives and the `Needs` it declares; `Objective` (a client method: a term of the local loss),
the `Sees` it declares and the `Seen` it receives; the constraints a constructor states in
its signature (`Range`, `Items`, `Flag`, and `checked` to enforce them when it is built from
Python; `Tune`, the range `python -m fedagg.compare` searches), and `run_experiment`, which runs what `python -m fedagg.run` runs and returns the
run's summary.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedagg.aggregators.base import AggregateResult, Aggregator, FedAvg
    from fedagg.aggregators.inputs import Needs, RoundInputs, ServerData
    from fedagg.clients.objectives import Objective, Seen, Sees
    from fedagg.config.constraints import Flag, Items, Range, Tune, checked

__version__ = "0.1.0"
__all__ = ["AggregateResult", "Aggregator", "FedAvg", "Flag", "Items", "Needs", "Objective", "Range", "RoundInputs",
           "Seen", "Sees", "ServerData", "Tune", "checked", "run_experiment"]
# imported when first asked for: `python -m fedagg.run` imports this package before its own first line, which starts
# partition.png's drawing process before torch is imported (fedagg/data/painter.py)
_WHERE = {**dict.fromkeys(["AggregateResult", "Aggregator", "FedAvg"], "fedagg.aggregators.base"),
          **dict.fromkeys(["Needs", "RoundInputs", "ServerData"], "fedagg.aggregators.inputs"),
          **dict.fromkeys(["Objective", "Seen", "Sees"], "fedagg.clients.objectives"),
          **dict.fromkeys(["Flag", "Items", "Range", "Tune", "checked"], "fedagg.config.constraints")}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'fedagg' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


def run_experiment(overrides: list[str], run_dir: str | Path) -> dict:
    """Run the job `python -m fedagg.run OVERRIDES hydra.run.dir=RUN_DIR` would run; return its summary.json."""
    from fedagg.run import run_experiment as run  # Hydra only when asked for

    return run(overrides, run_dir)
