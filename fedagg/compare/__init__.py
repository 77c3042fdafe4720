"""The fair comparison protocol: tune every method with the same budget on
validation data, select by the mean validation accuracy of the last rounds, confirm on fresh seeds on the test
set, report. `python -m fedagg.compare` runs it; the Hydra sweeper in `hydra_plugins/fedagg_compare` drives
the trials through whatever launcher is configured. Nothing here imports Hydra."""
