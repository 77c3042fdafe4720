"""Peak memory of a round of many clients on one base: low-rank adapters against full fine-tuning of the same
model, with each engine, each run in a fresh process.

    OMP_NUM_THREADS=1 python scripts/adapter_memory.py [--clients 10 100] [--dim 256] [--depth 4] [--rank 4] \
        [--batch-size 8] [--out outputs/adapter_memory]

Each run is `python -m fedagg.run` on the bundled digits (offline, partition=iid), model=vit_tiny widened to
--dim (so that the model, not its activations on 8x8 images, dominates; batches of --batch-size), one round in
which all --clients clients train, device=cpu, adapter=none (every parameter trains: FedAvg) or adapter=lora
(--rank on every Linear layer: FedIT), engine=sequential or parallel (engine.chunk_size=auto: as many clients at
once as its CPU budget holds, at least 64). GNU time's %M gives each process's peak resident set. The table also
gives the model's parameters and trainable ones (from the run's start-up line) and what one copy of the model
takes: were the base held once per client, a lora run of N clients would grow by about N copies of it over the
same run with fewer clients.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def command(clients: int, adapter: str, engine: str, args, run_dir: Path) -> list[str]:
    rule = "fedit" if adapter == "lora" else "fedavg"
    return ["/usr/bin/time", "-f", "PEAK_KB %M", sys.executable, "-m", "fedagg.run", "dataset=digits", "partition=iid",
            "model=vit_tiny", f"model.dim={args.dim}", f"model.depth={args.depth}",
            f"client.batch_size={args.batch_size}", f"num_clients={clients}", "rounds=1", "device=cpu",
            f"engine={engine}", f"adapter={adapter}", f"aggregator={rule}", "checkpoint_every=0",
            *([f"adapter.rank={args.rank}"] if adapter == "lora" else []), f"hydra.run.dir={run_dir}"]


def measure(clients: int, adapter: str, engine: str, args, folder: Path) -> dict:
    run_dir = folder / f"{adapter}_{engine}_{clients}"
    start = time.time()
    out = subprocess.run(command(clients, adapter, engine, args, run_dir), cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stdout[-2000:] + out.stderr[-2000:])
    text = out.stdout + out.stderr
    peak = int(re.search(r"PEAK_KB (\d+)", text).group(1)) / 1024
    shares = re.search(r"(\d+) trainable of (\d+) parameters", text)
    chunk = re.search(r"chunk_size=auto: (\d+) clients at once", text)
    at_once = min(clients, int(chunk.group(1))) if chunk else 1  # the sequential engine: one
    return {"peak_mb": peak, "seconds": time.time() - start, "at_once": at_once,
            "trainable": int(shares.group(1)) if shares else None, "total": int(shares.group(2)) if shares else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--out", default=None, help="where the runs go (default: a temporary folder)")
    args = parser.parse_args()
    folder = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="adapter_memory_"))
    rows = []
    for clients in args.clients:
        for engine in ("sequential", "parallel"):
            for adapter in ("none", "lora"):
                got = measure(clients, adapter, engine, args, folder)
                rows.append((clients, engine, adapter, got))
                print(f"{clients} clients, engine={engine}, adapter={adapter}: peak RSS {got['peak_mb']:.0f} MB "
                      f"({got['seconds']:.0f} s)", flush=True)
    total = next((g["total"] for *_, g in rows if g["total"]), None)
    print(f"\nmodel=vit_tiny model.dim={args.dim} model.depth={args.depth} on digits: {total:,} parameters, "
          f"{total * 4 / 2**20:.1f} MB a copy (fp32)\n")
    print("| clients | engine | clients in memory at once | adapter | trainable parameters | peak RSS (MB) |")
    print("|---:|---|---:|---|---:|---:|")
    for clients, engine, adapter, got in rows:
        trainable = got["trainable"] if adapter == "lora" else total
        print(f"| {clients} | {engine} | {got['at_once']} | {adapter} | {trainable:,} | {got['peak_mb']:.0f} |")


if __name__ == "__main__":
    main()
