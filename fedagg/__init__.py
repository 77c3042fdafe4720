"""fedagg: simulate federated learning on one device and compare aggregation rules."""

__version__ = "0.1.0"
