"""Seconds per round of each engine on a grid of workloads, and which engine `engine=auto` picks for each.

    python scripts/engine_grid.py                     # the whole grid on the CPU, one thread (17 minutes on a busy 2-core CPU)
    python scripts/engine_grid.py --device cuda       # the same grid on a GPU (larger client data)
    python scripts/engine_grid.py --quick --rounds 1  # every workload made small: a smoke test

It times rounds with scripts/bench.py's loop (a warm-up round kept out, then --rounds rounds with the engines
interleaved, so load from other processes spreads over both; medians) and writes, into --out, grid.md (the
table, the CPU model, the load average and the busiest processes at the start and at the end) and grid.json.
ResNet-20 and the LSTM train on random data of CIFAR's and Shakespeare's shapes (no files needed); the engines'
cost does not depend on the values.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedagg.engines.choice import RoundShape, choose, model_kind  # noqa: E402


def _bench():
    spec = importlib.util.spec_from_file_location("bench", Path(__file__).with_name("bench.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench = _bench()
W = bench.Workload
# what `python -m fedagg.run` runs with no overrides: digits, its MLP, 10 Dirichlet clients all in every round,
# conf/client/sgd.yaml's batch 32 and two local epochs
GRID = {
    "digits_default": W("digits_default", "digits", "mlp", 10, 10, "dirichlet", 32, local_epochs=2),
    "digits_5": W("digits_5", "digits", "mlp", 10, 5, "dirichlet", 32, local_epochs=2),  # clients_per_round=5
    "digits_2": W("digits_2", "digits", "mlp", 10, 2, "dirichlet", 32, local_epochs=2),
    "cross_device": bench.WORKLOADS["cross_device"],  # cnn_small, 100 of 1,000 MNIST clients, batch 10
    "cross_device_10": replace(bench.WORKLOADS["cross_device"], name="cross_device_10", per_round=10),
    "cross_device_b32": W("cross_device_b32", "mnist", "cnn_small", 1000, 100, "iid", 32, samples_per_client=60),
    # LeNet, 10 Dirichlet MNIST clients, batch 64; a third of MNIST (the same batches, fewer of them)
    "cross_silo": replace(bench.WORKLOADS["cross_silo"], max_samples=20_000),
    "mnist_mlr": W("mnist_mlr", "mnist", "mlr", 1000, 100, "iid", 10, samples_per_client=60),
    "lstm_text": W("lstm_text", "text_random", "lstm_shakespeare", 100, 10, "iid", 10, samples_per_client=20),
    "resnet20_10": W("resnet20_10", "cifar_random", "resnet20", 100, 10, "iid", 32, samples_per_client=32),
    "resnet20_100": W("resnet20_100", "cifar_random", "resnet20", 1000, 100, "iid", 32, samples_per_client=16),
    "resnet20_100_b10": W("resnet20_100_b10", "cifar_random", "resnet20", 1000, 100, "iid", 10, samples_per_client=10),
}
# On a GPU the client data of the random-data workloads grows to what a real run holds per client
ON_CUDA = {"cross_silo": dict(max_samples=None), "lstm_text": dict(samples_per_client=300),
           "resnet20_10": dict(samples_per_client=500), "resnet20_100": dict(samples_per_client=100),
           "resnet20_100_b10": dict(samples_per_client=100)}
QUICK = {
    "digits_default": dict(local_epochs=1),
    "digits_5": dict(local_epochs=1),
    "digits_2": dict(local_epochs=1),
    "cross_device_10": dict(num_clients=40, per_round=4),
    "cross_device_b32": dict(num_clients=40, per_round=20),
    "cross_device": dict(num_clients=40, per_round=20),
    "cross_silo": dict(num_clients=4, per_round=4, max_samples=2_000),
    "mnist_mlr": dict(num_clients=40, per_round=20),
    "lstm_text": dict(num_clients=8, per_round=4, samples_per_client=10),
    "resnet20_10": dict(num_clients=8, per_round=4, samples_per_client=8),
    "resnet20_100": dict(num_clients=40, per_round=20, samples_per_client=4),
    "resnet20_100_b10": dict(num_clients=40, per_round=20, samples_per_client=4),
}


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return "unknown (lscpu gave no model name)"


def machine_state() -> dict:
    """The load average and the busiest processes now: what else was running."""
    try:
        top = [line[:110] for line in subprocess.run(["ps", "-eo", "pcpu,etime,args", "--sort=-pcpu"], capture_output=True,
                                                      text=True, check=True).stdout.splitlines()[:8]]
    except (OSError, subprocess.CalledProcessError):
        top = []
    return {"load_average": list(os.getloadavg()), "busiest": top}


def shape_of(w, device: torch.device) -> RoundShape:
    """What engine=auto reads of this workload (the model built as the run builds it)."""
    # the shapes alone: one random sample (MNIST's are known)
    bundle = bench.load_bundle(replace(w, max_samples=1), ROOT / "unused") if w.dataset != "mnist" else None
    size = {"mnist": (10, 1, 28)}.get(w.dataset) or (bundle.num_classes, bundle.in_channels, bundle.image_size)
    model = bench.MODELS[w.model](num_classes=size[0], in_channels=size[1], image_size=size[2])
    return RoundShape(w.per_round, model_kind(model), sum(p.numel() for p in model.parameters()), w.batch_size,
                      device.type)


def workloads(args, device: torch.device) -> list:
    out = []
    for key in args.workloads.split(","):
        w = GRID[key.strip()]
        if device.type == "cuda":
            w = replace(w, **ON_CUDA.get(w.name, {}))
        if args.quick:
            w = replace(w, **QUICK[w.name])
        if w.dataset == "cifar_random" or w.dataset == "text_random":
            w = replace(w, max_samples=w.num_clients * w.samples_per_client)
        out.append(w)
    return out


def _faster(row: dict) -> str:
    """yes, no, or a tie: the engines within 5% of each other, which one sitting cannot tell apart."""
    return "yes" if row["auto_faster"] else ("tie (within 5%)" if abs(row["ratio"] - 1) < 0.05 else "no")


def table(rows: list[dict]) -> str:
    lines = ["| workload | clients a round | model | batch | s/round sequential | s/round parallel | parallel / sequential "
             "| auto picks | auto picked the faster |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['per_round']} | {r['model']} ({r['kind']}, {r['params']:,} params) | "
                     f"{r['batch_size']} | {r['sequential']:.3f} | {r['parallel']:.3f} | {r['ratio']:.2f} | "
                     f"{r['auto']} | {_faster(r)} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default=",".join(GRID), help="comma-separated: " + ", ".join(GRID))
    p.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads on the CPU (default 1)")
    p.add_argument("--quick", action="store_true", help="every workload made small, for a smoke test")
    p.add_argument("--data-root", type=Path, default=Path(os.environ.get("FEDAGG_DATA", "data")),
                   help="folder holding MNIST/raw (default: $FEDAGG_DATA, else ./data, as fedagg's data.root)")
    p.add_argument("--out", type=Path, default=None, help="folder for grid.md and grid.json "
                   "(default outputs/engine_grid/DATE_TIME)")
    args = p.parse_args(argv)
    started = time.perf_counter()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no GPU here")
    torch.set_num_threads(args.threads)
    if not args.data_root.exists() and (ROOT / args.data_root).exists():
        args.data_root = ROOT / args.data_root
    out = args.out or Path("outputs") / "engine_grid" / time.strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    # bench's run_workload reads these of its own command line
    opts = argparse.Namespace(rounds=args.rounds, data_root=args.data_root, chunk_size="auto", precision="fp32",
                              channels_last=False, compile=False)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{cpu_model()}, {args.threads} thread(s)"
    before = machine_state()
    print(f"device: {where}; load average {before['load_average'][0]:.2f}; {args.rounds} timed rounds", flush=True)
    rows = []
    for w in workloads(args, device):
        t0 = time.perf_counter()
        timed = {r["engine"]: r for r in bench.run_workload(w, opts, device, 1.0, limit_row=False)}
        shape = shape_of(w, device)
        auto, reason = choose(shape)
        seq, par = timed["sequential"]["s_per_round"], timed["parallel"]["s_per_round"]
        rows.append(dict(workload=w.name, per_round=w.per_round, model=w.model, kind=shape.kind, params=shape.params,
                         batch_size=w.batch_size, samples_per_client=w.samples_per_client, sequential=seq,
                         parallel=par, ratio=par / seq, auto=auto, reason=reason,
                         auto_faster=(auto == "parallel") == (par < seq), diff=timed["parallel"]["diff"]))
        print(f"  {w.name}: sequential {seq:.3f} s/round, parallel {par:.3f} ({par / seq:.2f}x); auto: {auto} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    after = machine_state()
    total = time.perf_counter() - started
    text = "\n".join([
        f"# Engine grid, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
        f"Device: {where}. Command: `python scripts/engine_grid.py {' '.join(sys.argv[1:] if argv is None else argv)}`"
        f". {args.rounds} timed rounds after a warm-up round, engines interleaved, medians. Total {total:.0f} s.", "",
        table(rows), "",
        f"Load average (1, 5, 15 min) at the start: {', '.join(f'{v:.2f}' for v in before['load_average'])}; "
        f"at the end: {', '.join(f'{v:.2f}' for v in after['load_average'])}.", "",
        "Busiest processes at the start:", "", "```", *before["busiest"], "```", "",
        "At the end:", "", "```", *after["busiest"], "```", ""])
    (out / "grid.md").write_text(text)
    (out / "grid.json").write_text(json.dumps(dict(device=where, rounds=args.rounds, quick=args.quick, rows=rows,
                                                   start=before, end=after, total_s=total), indent=1))
    print()
    print(table(rows))
    print(f"\nwrote {out / 'grid.md'} and grid.json; total wall time {total:.0f} s")


if __name__ == "__main__":
    main()
