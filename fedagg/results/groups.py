"""The config groups, defined once: the run records their choices, the results layer reads them.

Hydra-free on purpose (fedagg/run.py imports it; so do the table, plot and report code),
so that a list here and a list there cannot drift apart.
"""

GROUPS = ("dataset", "partition", "model", "aggregator", "client", "logger", "engine", "system", "attack", "channel")
RECORDED_CHOICES = (*GROUPS, "client/objective", "experiment")  # the group choices summary.json keeps
