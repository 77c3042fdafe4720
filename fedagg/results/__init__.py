"""Results as a library: run and sweep folders into pandas, tables as data, statistics, plots, reports.

    from fedagg.results import load_sweep, build_table
    runs = load_sweep("outputs/multirun/2025-01-01/12-00-00")    # one row per run

`python -m fedagg.results table|plot|report|stats FOLDER ...` is the command line. Nothing
here imports Hydra: a pip-installed user reads any sweep folder from a notebook.
"""

import importlib

# name -> module; loaded on first use, so that fedagg.run (which needs only the groups) does not import pandas
_EXPORTS = {"load_sweep": "runs", "load_curves": "runs", "load_weights": "runs", "load_clients": "runs",
            "load_trials": "runs", "ResultsError": "runs", "build_table": "table", "Table": "render"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"fedagg.results.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'fedagg.results' has no attribute {name!r}")
