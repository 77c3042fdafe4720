#!/usr/bin/env bash
# FedAvg vs FedProx (mu = 1) on Synthetic(1,1) in FedProx's Figure 1 setting (Li et al. 2020, Sec. 5.1
# and App. C.2): 30 devices, MLR, 10 devices a round, SGD lr 0.01, batch 10, E = 20 local epochs,
# 200 rounds; seeds 0, 1, 2 (the data is the same for every seed: dataset.seed). The sequential engine:
# on a CPU it is the faster one for MLR's many tiny batches. Prints the final and best test accuracy
# and the final training loss per method (mean and spread over the seeds), and how often the clients' mean
# training loss rose by more than 10% from one round to the next (FedProx's claim: the proximal term
# makes training on heterogeneous devices more stable).
#
#   scripts/fedprox_synthetic.sh [OUT_DIR] [extra overrides, e.g. rounds=20, system=stragglers system.fraction=0.9]
# With stragglers, FedProx's FedAvg drops them and its stragglers run whole epochs: add system.work=epochs_code
# and system.partial_work=drop to the FedAvg sweep (+experiment=fedprox_figures sets both per method).
# About 5 s a round per run at OMP_NUM_THREADS=1 on a 2-core CPU: six runs of 200 rounds are hours there.
set -euo pipefail
out=${1:-outputs/fedprox_synthetic}
shift || true
common=(dataset=synthetic dataset.alpha=1 dataset.beta=1 model=mlr num_clients=30 clients_per_round=10 rounds=200
        client.lr=0.01 client.batch_size=10 client.local_epochs=20 engine=sequential seed=0,1,2)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
python -m fedagg.run -m "${common[@]}" client/objective=none hydra.sweep.dir="$out/fedavg" "$@"
python -m fedagg.run -m "${common[@]}" client/objective=fedprox client.objective.mu=1 hydra.sweep.dir="$out/fedprox_mu1" "$@"
python - "$out" <<'PY'
import csv, statistics, sys
from pathlib import Path
for method in ("fedavg", "fedprox_mu1"):
    final, best, loss, rises = [], [], [], []
    for run in sorted(Path(sys.argv[1], method).glob("[0-9]*")):
        rows = list(csv.DictReader(open(run / "metrics.csv")))
        acc = [float(r["test_acc"]) for r in rows]
        train = [float(r["train_loss"]) for r in rows]
        final.append(acc[-1]); best.append(max(acc)); loss.append(train[-1])
        rises.append(sum(b > 1.1 * a for a, b in zip(train, train[1:])))
    show = lambda v: f"{statistics.mean(v):.4f} ± {statistics.stdev(v) if len(v) > 1 else 0:.4f}"
    print(f"{method:12s} runs={len(final)} final_acc={show(final)} best_acc={show(best)} "
          f"final_train_loss={show(loss)} loss_rises>10%={rises}")
PY
