"""Results as a library: run and sweep folders into pandas, tables as data, statistics, plots, reports.

    from fedagg.results import load_sweep, build_table
    runs = load_sweep("outputs/multirun/2025-01-01/12-00-00")    # one row per run

`python -m fedagg.results table|plot|report|stats FOLDER ...` is the command line. Nothing
here imports Hydra: a pip-installed user reads any sweep folder from a notebook.
"""
