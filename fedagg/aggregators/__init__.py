"""Server aggregation rules over flat parameter vectors (one class per method)."""

from fedagg.aggregators.base import AggregateResult, Aggregator, FedAvg

__all__ = ["AggregateResult", "Aggregator", "FedAvg"]
