"""How a run scales with its number of clients (the aim: memory and start-up linear in N, a round's time
independent of it): dataset=synthetic with N devices of 10 samples each (9 to train), an MLR, 100 clients a
round, 20 rounds, a checkpoint every 10.

    OMP_NUM_THREADS=1 python scripts/scale_clients.py [--sizes 1000 10000 100000] [--out outputs/scale]

For each N and aggregator (fedavg; scaffold, whose control variates are per-client state) it runs the job twice:
once through, and once SIGKILLed as soon as its first checkpoint is written and then resumed with resume=true. It
prints start-up (process start to the line before round 1), the mean seconds a round after round 1 (metrics.csv's
elapsed_s; with --eval-every, whose rows are the evaluated rounds only, the mean of all rounds), peak RSS, the
checkpoint's size, the size of the per-client state on disk, the seconds partition.png took (from partition.json
written to the picture on disk: it is drawn by a process of its own while the run trains), and whether the
resumed run's weights.csv and metrics.csv (without elapsed_s) equal the uninterrupted run's. The test set has a
sample a device, so evaluating grows with N: `--eval-every 20` times the rounds without it.
"""

from __future__ import annotations

import argparse
import csv
import json
import datetime as dt
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


EVAL_EVERY = 1  # --eval-every


def command(n: int, aggregator: str, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "fedagg.run", "dataset=synthetic", f"dataset.num_devices={n}", "num_clients=null",
            "dataset.size_mean=0", "dataset.size_sigma=0", "dataset.min_size=9", "model=mlr", "clients_per_round=100",
            "rounds=20", "checkpoint_every=10", f"eval_every={EVAL_EVERY}", f"aggregator={aggregator}", f"hydra.run.dir={run_dir}", *extra]


def stamp(line: str) -> float:
    return dt.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=dt.timezone.utc).timestamp()


def through(n: int, aggregator: str, run_dir: Path) -> dict:
    start = time.time()
    # GNU time's %M: this run's own peak resident set, in KB
    out = subprocess.run(["/usr/bin/time", "-f", "PEAK_KB %M", *command(n, aggregator, run_dir)], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stdout[-2000:] + out.stderr[-2000:])
    peak = int(re.search(r"PEAK_KB (\d+)", out.stderr).group(1))
    lines = (out.stdout + out.stderr).splitlines()
    ready = next(stamp(line) for line in lines if "torch thread" in line)
    elapsed = [float(row["elapsed_s"]) for row in rows(run_dir / "metrics.csv", drop="")]
    if len(elapsed) >= 2:
        per_round = (elapsed[-1] - elapsed[0]) / (len(elapsed) - 1)
    else:  # evaluated rounds only (--eval-every): every round's mean, round 1 included
        summary = json.loads((run_dir / "summary.json").read_text())
        per_round = float(summary["wall_time_s"]) / summary["rounds_completed"]
    state = sum(f.stat().st_size for f in (run_dir / "client_state").rglob("*") if f.is_file()) \
        if (run_dir / "client_state").exists() else 0
    picture = (run_dir / "partition.png").stat().st_mtime - (run_dir / "partition.json").stat().st_mtime
    return {"startup": ready - start, "round": per_round, "peak_mb": peak / 1024,
            "checkpoint_mb": (run_dir / "checkpoint.pt").stat().st_size / 1e6, "state_mb": state / 1e6,
            "picture_s": picture}


def killed_and_resumed(n: int, aggregator: str, run_dir: Path) -> None:
    proc = subprocess.Popen(command(n, aggregator, run_dir), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    while proc.poll() is None and not (run_dir / "checkpoint.pt").exists():
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    out = subprocess.run(command(n, aggregator, run_dir, "resume=true"), cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stdout[-2000:] + out.stderr[-2000:])


def rows(path: Path, drop: str = "elapsed_s") -> list[dict]:
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if k != drop} for row in csv.DictReader(f)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--aggregators", nargs="+", default=["fedavg", "scaffold"])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "scale")
    parser.add_argument("--eval-every", type=int, default=1, help="eval_every of the runs (1: every round)")
    args = parser.parse_args()
    global EVAL_EVERY
    EVAL_EVERY = args.eval_every
    print(f"{'clients':>8} {'aggregator':<10} {'start-up s':>10} {'s/round':>8} {'peak MB':>8} {'ckpt MB':>8} "
          f"{'state MB':>9} {'png s':>6}  resumed after SIGKILL", flush=True)
    for n in args.sizes:
        for aggregator in args.aggregators:
            once, again = args.out / f"{aggregator}_{n}", args.out / f"{aggregator}_{n}_killed"
            for d in (once, again):
                shutil.rmtree(d, ignore_errors=True)
            f = through(n, aggregator, once)
            killed_and_resumed(n, aggregator, again)
            same = all(rows(once / name) == rows(again / name) for name in ("metrics.csv", "weights.csv"))
            print(f"{n:>8} {aggregator:<10} {f['startup']:>10.2f} {f['round']:>8.2f} {f['peak_mb']:>8.0f} "
                  f"{f['checkpoint_mb']:>8.2f} {f['state_mb']:>9.1f} {f['picture_s']:>6.2f}  {'identical files' if same else 'DIFFERENT'}",
                  flush=True)


if __name__ == "__main__":
    main()
