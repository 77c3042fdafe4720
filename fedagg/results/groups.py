"""The config groups, defined once: the run records their choices, the results layer reads them; and a run's
method, the one identity tables, statistics, plots, reports and the comparison name it by.

Hydra-free on purpose (fedagg/run.py imports it; so do the table, plot and report code),
so that a list here and a list there cannot drift apart.
"""

from __future__ import annotations

GROUPS = ("dataset", "partition", "model", "aggregator", "client", "logger", "engine", "system", "clock", "attack",
          "channel", "sampler", "server", "adapter")
RECORDED_CHOICES = (*GROUPS, "client/objective", "experiment")  # the group choices summary.json keeps
PLAIN = (None, "none")  # the client objective of plain local training
BASE = "fedavg"  # the aggregator a client-only method (FedProx) runs with


def method_of(choices: dict, config: dict | None = None) -> str | None:
    """A run's method id. A table experiment's own `method` key (its rows) when the config has one; else the
    aggregator, or the client objective when it runs with FedAvg's server (`fedprox`: FedProx is FedAvg plus
    its objective), or both (`fedadam+fedprox`)."""
    own = (config or {}).get("method")
    if isinstance(own, str) and own:
        return own
    aggregator, objective = choices.get("aggregator"), choices.get("client/objective")
    if objective in PLAIN:
        return aggregator
    return objective if aggregator in (BASE, None) else f"{aggregator}+{objective}"


def method_name_of(choices: dict, config: dict | None = None) -> str | None:
    """How the method is shown: the table's label for it, else the `display_name` of its YAML(s), else its id."""
    config = config or {}
    method = method_of(choices, config)
    table = config.get("table") if isinstance(config.get("table"), dict) else {}
    labels = (table.get("labels") or {}).get("method") or {}
    if method in labels:
        return str(labels[method])
    aggregator = config.get("aggregator") if isinstance(config.get("aggregator"), dict) else {}
    client = config.get("client") if isinstance(config.get("client"), dict) else {}
    objective = client.get("objective") if isinstance(client.get("objective"), dict) else {}
    agg_name = aggregator.get("display_name") or choices.get("aggregator")
    obj_name = objective.get("display_name") or (None if choices.get("client/objective") in PLAIN
                                                 else choices.get("client/objective"))
    if isinstance(config.get("method"), str):
        return method  # a table experiment's own method without a label
    if obj_name is None:
        return str(agg_name)
    if choices.get("aggregator") in (BASE, None):
        return str(obj_name)
    return f"{agg_name} + {obj_name}"
