"""Time a round of client training per engine on named workloads, in one process.

    python scripts/bench.py                                   # all workloads, CPU or CUDA
    python scripts/bench.py --workloads cross_device --rounds 3 --chunk-size 100
    python scripts/bench.py --quick                           # smaller workloads: a smoke test

For each workload it runs one warm-up round per row (each engine and the limit), then --rounds timed rounds with
the engines interleaved (so load from other processes spreads over all of them), and
prints per engine: seconds per round (median), training samples per second, peak memory
during its rounds (RSS on the CPU, torch.cuda.max_memory_allocated on CUDA), its time
over the sequential engine's, its time over the limit, achieved training FLOP/s and their
share of a measured matmul peak, and how far its client models are from the sequential
engine's on the warm-up round ("+MB": how far the peak rose above the memory in use when
the round started). The limit is one pass of the round's samples through the
same model in batches of 500 (training mode: forward, backward, SGD step, data gathered
and prepared on the device): what the round would cost if the clients were one big batch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedagg.aggregators.base import FedAvg  # noqa: E402
from fedagg.clients.trainer import LocalSGD  # noqa: E402
from fedagg.data.datasets import DatasetBundle, digits, mnist  # noqa: E402
from fedagg.data.partition import dirichlet, iid  # noqa: E402
from fedagg.seeding import generator  # noqa: E402
from fedagg.engines import _packed  # noqa: E402
from fedagg.engines.base import RoundJob  # noqa: E402
from fedagg.engines.parallel import ParallelEngine  # noqa: E402
from fedagg.engines.sequential import SequentialEngine  # noqa: E402
from fedagg.loop.assembly import Parts, assemble  # noqa: E402
from fedagg.config.settings import Settings  # noqa: E402
from fedagg.sampling.pool import sample_clients  # noqa: E402
from fedagg.loop.splits import build_model  # noqa: E402
from fedagg.models.cnns import CNNSmall, LeNet  # noqa: E402
from fedagg.models.leaf import LSTMShakespeare  # noqa: E402
from fedagg.models.simple import MLP, MLR  # noqa: E402
from fedagg.models.flat import get_buffers, get_params  # noqa: E402
from fedagg.models.resnet_cifar import ResNet20  # noqa: E402

LIMIT_BATCH = 500


@dataclass
class Workload:
    name: str
    dataset: str  # mnist | digits | cifar_random | text_random
    model: str  # a key of MODELS
    num_clients: int
    per_round: int
    partition: str  # iid | dirichlet
    batch_size: int
    samples_per_client: int | None = None
    max_samples: int | None = None  # training pool kept (CIFAR-shaped data and text: how many are drawn)
    local_epochs: int = 1


WORKLOADS = {
    "cross_device": Workload("cross_device", "mnist", "cnn_small", 1000, 100, "iid", 10, samples_per_client=60),
    "cross_silo": Workload("cross_silo", "mnist", "lenet", 10, 10, "dirichlet", 64),
    "cifar_resnet20": Workload("cifar_resnet20", "cifar_random", "resnet20", 20, 20, "dirichlet", 128),  # --cifar-samples
}
# The objects are built in Python, as a notebook would (no YAML: only fedagg's edge composes configurations);
# each is what conf/model/<name>.yaml and conf/dataset/<name>.yaml give, and tests/test_bench_script.py checks that.
MODELS = {"cnn_small": partial(CNNSmall, hidden=50), "lenet": LeNet, "resnet20": partial(ResNet20, shortcut="A"),
          "mlp": partial(MLP, hidden=64), "mlr": MLR, "lstm_shakespeare": partial(LSTMShakespeare, embedding=8, hidden=256, layers=2)}
NORMALISATION = {"mnist": dict(mean=[0.1307], std=[0.3081], augment=False),
                 "digits": dict(mean=[0.3054], std=[0.3760], augment=False),
                 "cifar10": dict(mean=[0.4914, 0.4822, 0.4465], std=[0.247, 0.2435, 0.2616], augment=True)}
QUICK = {
    "cross_device": dict(num_clients=200, per_round=20),
    "cross_silo": dict(per_round=4, max_samples=12_000),
    "cifar_resnet20": dict(num_clients=8, per_round=4, max_samples=2_000),
}


def load_bundle(w: Workload, data_root: Path) -> DatasetBundle:
    if w.dataset == "digits":
        return digits(**NORMALISATION["digits"])
    if w.dataset == "text_random":  # Shakespeare's shape: 80 characters and the next one, a vocabulary of 80
        g = torch.Generator().manual_seed(0)
        n = w.max_samples or w.num_clients * (w.samples_per_client or 1)
        return DatasetBundle("text_random", torch.randint(0, 80, (n, 81), dtype=torch.uint8, generator=g),
                             torch.zeros(n, dtype=torch.long), torch.zeros(1, 81, dtype=torch.uint8),
                             torch.zeros(1, dtype=torch.long), 80, (0.0,), (1.0,), False, inputs="tokens")
    if w.dataset == "mnist":
        bundle = mnist(str(data_root), **NORMALISATION["mnist"])
        if w.max_samples is not None:
            bundle.train_x, bundle.train_y = bundle.train_x[: w.max_samples], bundle.train_y[: w.max_samples]
        return bundle
    norm = NORMALISATION["cifar10"]
    g = torch.Generator().manual_seed(0)
    n = w.max_samples or 50_000
    return DatasetBundle(
        name="cifar10_random", num_classes=10, mean=tuple(norm["mean"]), std=tuple(norm["std"]), augment=norm["augment"],
        train_x=torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g),
        train_y=torch.randint(0, 10, (n,), generator=g),
        test_x=torch.zeros(1, 3, 32, 32, dtype=torch.uint8), test_y=torch.zeros(1, dtype=torch.long),
    )


class PeakMemory:
    """Peak memory of the code run inside `with`: CUDA allocator peak, or the process's RSS high-water mark."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.peak, self.start = device, 0, 0

    @property
    def rise(self) -> int:
        """How far the peak rose above what was in use when the block started."""
        return max(self.peak - self.start, 0)

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
            return self
        self.start = _rss_bytes()
        self._reset_ok = _reset_rss_peak()
        self._stop = threading.Event()
        self._sampled = _rss_bytes()
        if not self._reset_ok:  # sample instead: VmHWM cannot be reset here
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.002):
            self._sampled = max(self._sampled, _rss_bytes())

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
        elif self._reset_ok:
            self.peak = _proc_status("VmHWM")
        else:
            self._stop.set()
            self._thread.join()
            self.peak = self._sampled


def _proc_status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _rss_bytes() -> int:
    return _proc_status("VmRSS")


def _reset_rss_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of a large square matmul: the device's practical peak for `dtype`."""
    n = 8192 if device.type == "cuda" else 2048
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    a @ b
    best = float("inf")
    for _ in range(5):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


class LimitPass:
    """The round's samples as one big-batch pass through a plain copy of the model."""

    def __init__(self, model, data, args) -> None:
        self.model, self.data, self.args = model, data, args
        if args.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)

    def train_round(self, idx: torch.Tensor) -> None:
        self.model.train()
        dev = self.data.device
        cast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=self.args.precision == "bf16")
        for batch in idx.split(LIMIT_BATCH):
            x, y = self.data.train_batch(batch, None) if not self.data.augment else self._augmented(batch)
            if self.args.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with cast:
                loss = F.cross_entropy(self.model(x).float(), y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()

    def _augmented(self, batch):
        return self.data.train_batch(batch, generator(0, "limit", device=self.data.device))


def run_workload(w: Workload, args, device: torch.device, peak_flops: float, limit_row: bool = True) -> list[dict]:
    """The rows of `w`: each engine's, and the limit's unless `limit_row` is off (then no FLOP count either)."""
    bundle = load_bundle(w, args.data_root)
    if w.partition == "iid":
        split = partial(iid, samples_per_client=w.samples_per_client)
    else:
        split = partial(dirichlet, alpha=0.5)
    factory = MODELS[w.model]
    settings = Settings(seed=0, rounds=args.rounds + 1, num_clients=w.num_clients, clients_per_round=w.per_round)
    trainer_kw = dict(lr=0.05, momentum=0.0, local_epochs=w.local_epochs, batch_size=w.batch_size)
    engines = {
        "sequential": SequentialEngine(),
        "parallel": ParallelEngine(chunk_size=args.chunk_size, precision=args.precision,
                                   channels_last=args.channels_last, compile=args.compile),
    }
    fed = assemble(Parts(dataset=lambda root, download: bundle, partition=split, model=factory, aggregator=FedAvg(),
                         client=LocalSGD(**trainer_kw), engine=engines["sequential"]), settings,
                   data_root=args.data_root, device=device)
    model, data, clients = fed.model, fed.data, fed.clients
    gp, gb = get_params(model), get_buffers(model)
    limit = LimitPass(build_model(factory, bundle, 0, device), data, args)
    trainers = {name: LocalSGD(**trainer_kw) for name in engines}
    times = {name: [] for name in (*engines, "limit")[: 3 if limit_row else 2]}
    peaks = {name: 0 for name in times}
    rises = {name: 0 for name in times}
    results = {}
    samples = []
    for r in range(1, args.rounds + 2):  # round 1 warms up
        chosen = [clients[i] for i in sample_clients(settings, r)]
        idx = torch.cat([c.train_idx for c in chosen])
        samples.append(idx.numel())
        for name in times:
            with PeakMemory(device) as mem:
                sync(device)
                t0 = time.perf_counter()
                if name == "limit":
                    limit.train_round(idx)
                else:
                    out = engines[name].train_round(RoundJob(model, trainers[name], data, chosen, gp.clone(),
                                                             gb.clone(), lr=0.05, seed=0, round=r))
                sync(device)
                elapsed = time.perf_counter() - t0
            if r == 1:  # the warm-up round of every row, the limit's included: kept out of the timings
                if name != "limit":
                    results[name] = out.params
            else:
                times[name].append(elapsed)
                peaks[name] = max(peaks[name], mem.peak)
                rises[name] = max(rises[name], mem.rise)
    flops = float("nan")
    if limit_row:
        flop_idx = torch.cat([c.train_idx for c in [clients[i] for i in sample_clients(settings, 2)]])
        with FlopCounterMode(display=False) as counter:
            limit.train_round(flop_idx)
        flops = counter.get_total_flops() * (sum(samples[1:]) / len(samples[1:])) / flop_idx.numel()
    limit_s = statistics.median(times["limit"]) if limit_row else float("nan")
    ref = results["sequential"]
    rows = []
    for name in times:
        sec = statistics.median(times[name])
        rows.append(dict(
            workload=w.name, engine=name, s_per_round=sec, samples_per_s=statistics.mean(samples[1:]) / sec,
            peak_mb=peaks[name] / 2**20, rise_mb=rises[name] / 2**20, vs_seq=sec / statistics.median(times["sequential"]),
            vs_limit=sec / limit_s, gflops=flops / sec / 1e9,
            peak_share=flops / sec / peak_flops,
            diff=(float((results[name] - ref).norm() / ref.norm()) if name in results else None),
        ))
    return rows


def print_table(rows: list[dict]) -> None:
    head = (f"{'workload':15s} {'engine':10s} {'s/round':>8s} {'samples/s':>10s} {'peak MB':>8s} {'+MB':>6s} "
            f"{'/seq':>6s} {'/limit':>7s} {'GFLOP/s':>8s} {'%peak':>6s} {'rel diff':>9s}")
    print(head)
    print("-" * len(head))
    for r in rows:
        diff = "" if r["diff"] is None else f"{r['diff']:.1e}"
        print(f"{r['workload']:15s} {r['engine']:10s} {r['s_per_round']:8.3f} {r['samples_per_s']:10.0f} "
              f"{r['peak_mb']:8.0f} {r['rise_mb']:6.0f} {r['vs_seq']:6.2f} {r['vs_limit']:7.2f} {r['gflops']:8.2f} "
              f"{100 * r['peak_share']:5.1f}% {diff:>9s}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    p.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--chunk-size", type=lambda v: v if v == "auto" else int(v), default="auto",
                   help="engine.chunk_size of the parallel engine: auto (the default) or a number")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--compile", action="store_true", help="engine.compile=true (torch.compile)")
    p.add_argument("--channels-last", action="store_true", help="engine.channels_last=true")
    p.add_argument("--quick", action="store_true", help="smaller workloads, for a smoke test")
    p.add_argument("--data-root", type=Path, default=Path(os.environ.get("FEDAGG_DATA", "data")),
                   help="folder holding MNIST/raw (default: $FEDAGG_DATA, else ./data, as fedagg's data.root)")
    p.add_argument("--cifar-samples", type=int, default=None,
                   help="size of the CIFAR-shaped training pool (default 50,000 on CUDA, 5,000 on the CPU)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--grouped-conv", action="store_true",
                   help="the parallel engine's CPU convolutions as before: grouped, except per client for large "
                        "batches into input layers")
    p.add_argument("--tf32", action="store_true", help="TF32 matmuls and convolutions (fedagg's tf32=true); off by default")
    args = p.parse_args(argv)
    _packed.CPU_CONV_LOOP = not args.grouped_conv
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32  # one setting for both
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.data_root.exists() and (ROOT / args.data_root).exists():
        args.data_root = ROOT / args.data_root
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    peak = matmul_peak(device, dtype)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {name}; matmul peak {peak / 1e9:.1f} GFLOP/s ({args.precision}); chunk_size={args.chunk_size}, "
          f"precision={args.precision}, channels_last={args.channels_last}, compile={args.compile}, tf32={args.tf32}, "
          f"rounds={args.rounds}{', quick' if args.quick else ''}")
    rows = []
    for key in args.workloads.split(","):
        w = WORKLOADS[key.strip()]
        if w.dataset == "cifar_random":
            w = Workload(**{**w.__dict__, "max_samples": args.cifar_samples or (50_000 if device.type == "cuda" else 5_000)})
        if args.quick:
            w = Workload(**{**w.__dict__, **QUICK[w.name]})
        t0 = time.perf_counter()
        rows += run_workload(w, args, device, peak)
        print(f"  {w.name}: {w.per_round} of {w.num_clients} clients per round, done in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    print()
    print_table(rows)


if __name__ == "__main__":
    main()
