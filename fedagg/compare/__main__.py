"""python -m fedagg.compare methods=[fedavg,fedprox,...] budget=16 confirm_seeds=5 [any run override ...]

The protocol's own keys (`--help` lists them) become the settings of the `fedagg_compare` Hydra sweeper;
everything else is composed as `python -m fedagg.run` composes a run (groups, keys, experiment files,
searchpath, hydra/launcher=...). The comparison's folder is hydra.sweep.dir (default
outputs/compare/<date>/<time>): run the same command with the same hydra.sweep.dir to continue a stopped
comparison. The command line is read at the Hydra edge (fedagg/edge/compare_line.py).
"""

from fedagg.edge.compare_line import main

if __name__ == "__main__":
    main()
