"""Time a round of the cross_device workload in fedagg and in its peers: Flower's simulation and a plain PyTorch loop.

    OMP_NUM_THREADS=1 python scripts/peer_bench.py                 # one thread; Flower when installed
    OMP_NUM_THREADS=2 python scripts/peer_bench.py --threads 2     # two threads; Flower: two client actors
    pip install -e ".[peers]"                                      # Flower's simulation with Ray

The workload is scripts/bench.py's cross_device: MNIST, cnn_small, 1,000 IID clients of 60 samples, 100 sampled
a round by fedagg's seeded sampler, batch 10, one local epoch, fedagg's default learning rate, FedAvg weighted
by samples. Every row trains the same clients on the same batches in the same order (fedagg's partition,
sampling and batch plan), from the same initial model:

- fedagg parallel / sequential: the engine trains the round, fedagg's FedAvg aggregates it;
- plain PyTorch: per client, load the global state, torch.optim.SGD over its batches, add to the weighted mean;
- Flower: `flwr.simulation.run_simulation` (Ray), Flower's FedAvg (fraction_train = 100 / 1,000), one CPU per
  client actor and as many actors as --threads; the client's train is the plain loop's.

A round is timed from the start of its training to its aggregated model; round 1 warms up and is left out; the
median of the others is printed. The in-process rows take turns round by round, in two blocks, before and after
Flower's simulation, whose start-up (Ray and its actors) with its warm-up round is printed apart. The rows' global
models after round 1 are compared with the sequential engine's: the largest absolute difference.

Beside the wall time, each row's CPU seconds a round: this process's, and for Flower its driver's plus its client
actors' (Ray's own services are not counted). On a machine others are using, a framework spread over several
processes is given more of the CPU than one process is, so the CPU seconds compare the work itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers.workload import FedaggEngine, PlainLoop, Shared, Workload  # noqa: E402
import bench  # noqa: E402
from fedagg.engines.parallel import ParallelEngine  # noqa: E402
from fedagg.engines.sequential import SequentialEngine  # noqa: E402

INSTALL = 'pip install -e ".[peers]"'


def load_flower():
    """Flower's module, or None with one line saying what to install."""
    try:
        from peers import flower_app
    except ModuleNotFoundError as err:
        missing = (err.name or "").split(".")[0]
        if missing not in ("flwr", "ray"):
            raise
        print(f"Flower's simulation is not installed (no module {missing!r}): {INSTALL} adds it; "
              f"timing fedagg and the plain loop only", flush=True)
        return None
    return flower_app


def in_process_block(shared: Shared, rounds: int, times: dict, cpus: dict, firsts: dict) -> None:
    """Fresh rows from the initial model, taking turns round by round; round 1 warms up."""
    rows = [FedaggEngine(shared, "fedagg parallel", ParallelEngine()),
            FedaggEngine(shared, "fedagg sequential", SequentialEngine()), PlainLoop(shared)]
    for r in range(1, rounds + 2):
        for row in rows:
            t0, c0 = time.perf_counter(), time.process_time()
            row.round(r)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            if r == 1:
                firsts.setdefault(row.name, row.params().clone())
            else:
                times.setdefault(row.name, []).append(elapsed)
                cpus.setdefault(row.name, []).append(cpu)


def flower_block(flower, shared: Shared, rounds: int, threads: int, times: dict, cpus: dict, firsts: dict) -> dict:
    """Flower's simulation of the same rounds; what it spent outside the timed rounds, in seconds."""
    ids = {r: [c.id for c in shared.chosen(r)] for r in range(1, rounds + 2)}
    orders = {f"{r}:{cid}": shared.order(shared.clients[cid], r) for r, round_ids in ids.items() for cid in round_ids}
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "work.pt")
        torch.save({"x": shared.x, "y": shared.y, "orders": orders, "model": shared.new_model(),
                    "batch_size": shared.w.batch_size, "epochs": shared.w.local_epochs}, path)
        strategy, t0, t1 = flower.simulate(shared.initial, ids, path, shared.w.num_clients, threads)
    timed = range(2, rounds + 2)
    times["Flower"] = [strategy.ended[r] - strategy.started[r] for r in timed]
    cpus["Flower"] = [strategy.driver_cpu[r] + strategy.actor_cpu[r] for r in timed]
    firsts["Flower"] = shared.flat(strategy.first)
    # Ray and its actors start while round 1's nodes wait for them: start-up and warm-up round are one span
    return {"CPU s a round in the driver": statistics.median(strategy.driver_cpu[r] for r in timed),
            "in the client actors": statistics.median(strategy.actor_cpu[r] for r in timed),
            "start to the end of round 1 (Ray, actors, warm-up)": strategy.ended[1] - t0,
            "end of the last round to the return": t1 - strategy.ended[rounds + 1]}


def report(times: dict, cpus: dict, firsts: dict, outside: dict | None, args) -> list[str]:
    """One line per row: median wall and CPU seconds a round, and each over fedagg parallel's."""
    med = {name: (statistics.median(times[name]), statistics.median(cpus[name])) for name in times}
    base, ref = med["fedagg parallel"], firsts["fedagg sequential"]
    lines = [f"{'framework':18s} {'s/round':>8s} {'min':>7s} {'max':>7s} {'CPU s':>7s} {'rounds':>6s} "
             f"{'/ parallel':>10s} {'CPU / parallel':>14s} {'max |w - w_seq|, round 1':>25s}"]
    for name, t in times.items():
        diff = (firsts[name] - ref).abs().max().item()
        lines.append(f"{name:18s} {med[name][0]:8.3f} {min(t):7.3f} {max(t):7.3f} {med[name][1]:7.3f} {len(t):6d} "
                     f"{med[name][0] / base[0]:10.2f} {med[name][1] / base[1]:14.2f} {diff:25.1e}")
    if outside is not None:
        lines.append(f"Flower, {args.clients} nodes: " + ", ".join(f"{k} {v:.2f} s" for k, v in outside.items()))
    return lines


def main(argv=None) -> list[str]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the in-process rows; Flower's CPUs "
                   "(client actors of one thread each)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per block after one warm-up round")
    p.add_argument("--clients", type=int, default=1000, help="clients in the federation")
    p.add_argument("--per-round", type=int, default=100, help="clients sampled a round")
    p.add_argument("--samples", type=int, default=60, help="training samples per client")
    p.add_argument("--no-flower", action="store_true", help="skip Flower even when it is installed")
    p.add_argument("--data-root", type=Path, default=Path(os.environ.get("FEDAGG_DATA", "data")),
                   help="folder holding MNIST/raw (default: $FEDAGG_DATA, else ./data, as fedagg's data.root)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not args.data_root.exists() and (bench.ROOT / args.data_root).exists():
        args.data_root = bench.ROOT / args.data_root
    flower = None if args.no_flower else load_flower()
    w = Workload(num_clients=args.clients, per_round=args.per_round, samples_per_client=args.samples)
    shared = Shared(bench.load_bundle(bench.WORKLOADS["cross_device"], args.data_root), w, rounds=args.rounds + 1)
    print(f"{w.per_round} of {w.num_clients} clients a round, {w.samples_per_client} samples each, batch "
          f"{w.batch_size}, {w.model}, lr {shared.trainer.lr}; torch {torch.__version__}, {args.threads} thread(s)",
          flush=True)
    times, cpus, firsts, outside = {}, {}, {}, None
    in_process_block(shared, args.rounds, times, cpus, firsts)
    if flower is not None:
        outside = flower_block(flower, shared, args.rounds, args.threads, times, cpus, firsts)
        in_process_block(shared, args.rounds, times, cpus, firsts)
    lines = report(times, cpus, firsts, outside, args)
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
