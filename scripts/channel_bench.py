"""What the upload channel costs and what it keeps.

MNIST MLP, 1,000 clients, 100 a round, 50 rounds, 3 seeds: FedAvg with channel none, topk
(ρ = 0.01, with and without error feedback), sign and qsgd (s = 4): final accuracy and bits
uploaded; DP-FedAvg at z ∈ {0.5, 1.0}, fixed and adaptive clipping: final accuracy and ε at
δ = 1e-5. Writes OUT/table.md and OUT/acc_vs_bits.png; every run keeps its own folder
(rerunning skips completed ones: resume=true).

    OMP_NUM_THREADS=1 python -m scripts.channel_bench --out /tmp/channel_bench --data data
    (--rounds 5 --seeds 0 for a quick look)
"""

from __future__ import annotations

import argparse
import os
import csv
import json
from pathlib import Path

from fedagg import run_experiment

SETTINGS = {
    "none": [],
    "topk_ef": ["channel=topk", "channel.topk.ratio=0.01", "channel.topk.error_feedback=true"],
    "topk_noef": ["channel=topk", "channel.topk.ratio=0.01", "channel.topk.error_feedback=false"],
    "sign": ["channel=sign"],
    "qsgd4": ["channel=qsgd", "channel.qsgd.levels=4"],
    **{f"dp_z{z}_{kind}": ["channel=dp", f"channel.dp.noise_multiplier={z}", f"channel.dp.adaptive={kind == 'adaptive'}",
                           "channel.dp.delta=1e-5", "aggregator.weighting=uniform"]
       for z in (0.5, 1.0) for kind in ("fixed", "adaptive")},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--data", default=os.environ.get("FEDAGG_DATA", "data"))
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--only", nargs="*", help="settings to run (default: all)")
    args = ap.parse_args(argv)
    base = ["dataset=mnist", "model=mlp", "num_clients=1000", "clients_per_round=100", f"rounds={args.rounds}",
            f"data.root={args.data}", "data.download=false", "eval_every=5", "resume=true"]
    rows = []
    for name, extra in SETTINGS.items():
        if args.only and name not in args.only:
            continue
        for seed in args.seeds:
            folder = args.out / name / f"seed{seed}"
            summary = run_experiment([*base, *extra, f"seed={seed}"], folder)
            curve = list(csv.DictReader(open(folder / "metrics.csv")))
            rows.append({"setting": name, "seed": seed, "final_acc": summary.get("final_test_acc"),
                         "bits_up_total": int(curve[-1]["bits_up_total"]), "eps": summary.get("final_dp_epsilon"),
                         "curve": [(int(r["bits_up_total"]), float(r["test_acc"])) for r in curve if r["test_acc"]]})
    (args.out / "rows.json").write_text(json.dumps(rows, indent=1))
    lines = ["| channel | final acc (mean ± sd over seeds) | total bits up | ε (δ = 1e-5) |", "|---|---|---|---|"]
    for name in dict.fromkeys(r["setting"] for r in rows):
        mine = [r for r in rows if r["setting"] == name]
        accs = [r["final_acc"] for r in mine]
        mean = sum(accs) / len(accs)
        sd = (sum((a - mean) ** 2 for a in accs) / max(1, len(accs) - 1)) ** 0.5
        eps = mine[0]["eps"]
        lines.append(f"| {name} | {mean:.4f} ± {sd:.4f} | {mine[0]['bits_up_total']:.3e} | "
                     f"{'' if eps is None else f'{eps:.2f}'} |")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(r["setting"] for r in rows):
        first = next(r for r in rows if r["setting"] == name and r["curve"])
        bits, acc = zip(*first["curve"])
        ax.plot(bits, acc, label=name, marker=".")
    ax.set_xscale("log")
    ax.set_xlabel("cumulative bits uploaded")
    ax.set_ylabel("test accuracy")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "acc_vs_bits.png", dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
