"""How long a run takes to reach its first round, from the command line (the aim: under 3 s at 1,000 and 3,597
clients, a download excluded; under 2 s for the README's default run).

    OMP_NUM_THREADS=1 python scripts/startup_time.py [--repeat 3] [-- extra overrides]
    OMP_NUM_THREADS=1 python scripts/startup_time.py --default-run [--repeat 3]

`--default-run` times `python -m fedagg.run rounds=1` (digits, MLP) from the command to its exit, less its one
round (metrics.csv's elapsed_s): start-up and the end of a run together, as the speed bars of the README count it.

runs `python -m fedagg.run` with each client count (one round, MNIST from data.root, an MLR) and prints, per
run, the seconds from starting the process to the log line that precedes the first round ("computing with ...
torch thread(s)") and to the first round's progress line. Timings: measure on a quiet machine.
FEMNIST, once its dataset is there:  --clients 3597 -- dataset=femnist model=cnn_femnist partition=natural
"""

from __future__ import annotations

import argparse
import os
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(clients: int, extra: list[str], data_root: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [sys.executable, "-m", "fedagg.run", "dataset=mnist", "model=mlr", f"data.root={data_root}",
               f"num_clients={clients}", "partition=iid", "rounds=1", "checkpoint_every=0", "data.download=false",
               f"hydra.run.dir={run_dir}", *extra]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ready = first = None
        for line in proc.stdout:
            now = time.perf_counter() - start
            if ready is None and "torch thread" in line:
                ready = now
            if first is None and "round 1/" in line:
                first = now
        if proc.wait() != 0:
            raise SystemExit(f"the run failed: {' '.join(cmd)}")
        return ready, first


def default_run() -> tuple[float, float]:
    """(wall seconds of the default run with rounds=1, less its round; its round's seconds)."""
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [sys.executable, "-m", "fedagg.run", "rounds=1", f"hydra.run.dir={run_dir}"]
        start = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
        wall = time.perf_counter() - start
        with open(Path(run_dir) / "metrics.csv", newline="") as f:
            one_round = float(next(csv.DictReader(f))["elapsed_s"])
        return wall - one_round, one_round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 3597])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data-root", default=os.environ.get("FEDAGG_DATA", "data"))  # as fedagg's data.root
    parser.add_argument("--default-run", action="store_true", help="time the README's default run instead")
    parser.add_argument("extra", nargs="*", help="further overrides, after --")
    args = parser.parse_args()
    if args.default_run:
        for _ in range(args.repeat):
            startup, one_round = default_run()
            print(f"default run: {startup:.2f} s besides its round ({one_round:.2f} s)", flush=True)
        return
    for clients in args.clients:
        for _ in range(args.repeat):
            ready, first = one_run(clients, args.extra, args.data_root)
            print(f"{clients} clients: ready to train after {ready:.2f} s, round 1 logged after {first:.2f} s",
                  flush=True)


if __name__ == "__main__":
    main()
