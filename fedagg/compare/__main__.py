"""python -m fedagg.compare methods=[fedavg,fedprox,...] budget=16 confirm_seeds=5 [any run override ...]

The protocol's own keys (methods, budget, tune_seeds, confirm_seeds, baseline, val_frac, batch, sampler_seed)
become the settings of the `fedagg_compare` Hydra sweeper; everything else is composed as `python -m
fedagg.run` composes a run (groups, keys, experiment files, searchpath, hydra/launcher=...). The comparison's
folder is hydra.sweep.dir (default outputs/compare/<date>/<time>): run the same command with the same
hydra.sweep.dir to continue a stopped comparison.
"""

from __future__ import annotations

import runpy
import sys

KEYS = ("methods", "budget", "tune_seeds", "confirm_seeds", "baseline", "val_frac", "batch", "sampler_seed", "validation",
        "held_out")


def translate(argv: list[str]) -> list[str]:
    """fedagg.run's command line for the comparison's."""
    out = ["-m", "hydra/sweeper=fedagg_compare"]
    if not any(a.startswith("hydra.sweep.dir=") for a in argv):
        out.append("hydra.sweep.dir=outputs/compare/${now:%Y-%m-%d}/${now:%H-%M-%S}")
    for arg in argv:
        key = arg.split("=", 1)[0]
        out.append(f"hydra.sweeper.{arg}" if key in KEYS else arg)
    return out


def main() -> None:
    sys.argv = ["fedagg.run", *translate(sys.argv[1:])]
    runpy.run_module("fedagg.run", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
