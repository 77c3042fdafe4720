"""Server aggregation rules over flat parameter vectors (one class per method)."""

from fedagg.aggregators.base import Aggregator, FedAvg

__all__ = ["Aggregator", "FedAvg"]
