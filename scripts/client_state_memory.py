"""SCAFFOLD's per-client state at FEMNIST scale: host memory, checkpoint size and disk, with `ClientStore`.

    OMP_NUM_THREADS=1 python scripts/client_state_memory.py [--clients 3597] [--params 6603710] \
        [--per-round 10] [--rounds 30] [--checkpoint-every 10] [--budget-mb 2048] [--folder DIR]

Runs SCAFFOLD's client half as a round does (each sampled client reads its c_k, trains, writes c_k⁺; the
training itself is replaced by random numbers of the model's size: the state is what is measured), writes a
checkpoint's worth of its state every few rounds, and prints the peak resident memory (getrusage), the store's
bytes in memory, the client-state files on disk and the checkpoint's size. A dense dict, as before the store,
would hold clients x params x 4 bytes (printed for comparison). The default model size is cnn_femnist's
(6,603,710 parameters, 26 MB a client). Disk use grows with the clients touched (26 MB each): keep
--rounds x --per-round within the free space of --folder.
"""

from __future__ import annotations

import argparse
import io
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's fedagg
import fedagg.clients.store as store_module  # noqa: E402
from fedagg.aggregators.scaffold import ScaffoldClient  # noqa: E402
from fedagg.clients.objectives import LocalWork  # noqa: E402

MB = 1 << 20


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=3597)
    parser.add_argument("--params", type=int, default=6_603_710)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--budget-mb", type=int, default=store_module.MEMORY_BUDGET // MB)
    parser.add_argument("--folder", default=None, help="where the client state goes (default: a temp folder)")
    args = parser.parse_args()
    store_module.MEMORY_BUDGET = args.budget_mb * MB
    root = Path(args.folder or tempfile.mkdtemp(prefix="client_state_"))
    half = ScaffoldClient()
    for name, store in half.client_stores().items():
        store.attach(root / name)
    g = torch.Generator().manual_seed(0)
    global_params = torch.zeros(args.params)
    half.c = torch.zeros(args.params)
    start, ckpt_bytes, touched = time.perf_counter(), 0, set()
    for r in range(1, args.rounds + 1):
        ids = torch.randperm(args.clients, generator=g)[:args.per_round].tolist()
        for cid in ids:
            half.client_state(cid, global_params)  # what local training reads
            trained = global_params + 0.01 * torch.randn(args.params, generator=g)
            half.after_training(cid, trained, global_params, LocalWork(steps=5, lr=0.01))
            touched.add(cid)
        if r % args.checkpoint_every == 0:
            buffer = io.BytesIO()
            torch.save(half.state_dict(), buffer)
            ckpt_bytes = buffer.tell()
            print(f"round {r}: {len(touched)} clients with state; checkpoint of it {ckpt_bytes / MB:.1f} MB; "
                  f"in memory {half.variates.memory_bytes / MB:.0f} MB; on disk {folder_bytes(root) / MB:.0f} MB; "
                  f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB", flush=True)
    dense = args.clients * args.params * 4
    print(f"dense (a dict of every client's c_k, as before): {dense / 1e9:.1f} GB in memory and in every checkpoint")
    print(f"store: peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB with a "
          f"{args.budget_mb} MB budget; last checkpoint {ckpt_bytes / MB:.1f} MB; {folder_bytes(root) / MB:.0f} MB "
          f"on disk for {len(touched)} clients ({time.perf_counter() - start:.0f} s)")
    if args.folder is None:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
