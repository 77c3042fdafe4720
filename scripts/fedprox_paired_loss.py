"""Paired differences over seeds of a Synthetic sweep's final global training loss, test accuracy and test loss.

FedProx's Figures 1 and 2 plot the global model's loss on every device's training samples; metrics.csv's
train_loss is the round's participants' loss during local training (with FedAvg dropping 90% stragglers, one
client's), so the training loss is recomputed here from each run's model.pt on the whole Synthetic training set.
The baseline is FedAvg, else FedProx with mu = 0; the interval is a paired t interval (as `fedagg.results`
uses for fewer than 6 pairs).

    python scripts/fedprox_paired_loss.py outputs/fedprox36/fig1 outputs/fedprox36/fig2/synthetic_1_1
"""
import csv
import json
import sys
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from fedagg.data.synthetic import synthetic


def runs(folder):
    """{run folder: (its resolved config, its summary)} for every run below `folder`."""
    out = {}
    for s in Path(folder).rglob("summary.json"):
        d = json.loads(s.read_text())
        out[s.parent] = (d["config"], d)
    return out


def global_train_loss(run, c):
    ds = c["dataset"]
    b = synthetic(alpha=ds["alpha"], beta=ds["beta"], iid=ds["iid"], num_devices=ds["num_devices"], seed=ds["seed"])
    w = torch.load(run / "model.pt")
    W, bias = w["fc.weight"], w["fc.bias"]  # mlr: one linear layer; Synthetic's mean 0, std 1 leave x as is
    logits = b.train_x.view(len(b.train_x), -1) @ W.T + bias
    return float(torch.nn.functional.cross_entropy(logits, b.train_y))


def last(run, key):
    with open(run / "metrics.csv") as f:
        return float(list(csv.DictReader(f))[-1][key])


def label(c):
    obj = c["client"]["objective"]
    mu = obj.get("mu")
    pw = (c.get("system") or {}).get("partial_work")
    return f"{'fedprox mu=' + str(float(mu)) if mu is not None else 'fedavg'}{' ' + pw if pw else ''}"


def table(folder, baseline_pred):
    per = {}
    for run, (c, d) in runs(folder).items():
        per.setdefault(label(c), {})[c["seed"]] = (global_train_loss(run, c), d["final_test_acc"], last(run, "test_loss"),
                                                   d["status"])
    base = next(k for k in per if baseline_pred(k))
    print(f"## {folder}  (baseline: {base})")
    for k, v in per.items():
        vals = np.array([[v[s][0], v[s][1], v[s][2]] for s in sorted(v)])
        print(f"{k:28s} seeds={sorted(v)} status={[v[s][3] for s in sorted(v)]} train_loss={np.round(vals[:,0],4).tolist()} "
              f"test_acc={np.round(vals[:,1],4).tolist()}")
        if k == base:
            continue
        seeds = sorted(set(v) & set(per[base]))
        for i, name in enumerate(("train_loss", "test_acc", "test_loss")):
            diff = np.array([v[s][i] - per[base][s][i] for s in seeds])
            m = diff.mean()
            se = diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else float("nan")  # one pair: no interval
            h = stats.t.ppf(0.975, len(diff) - 1) * se
            print(f"    {k} - {base}: {name} diff {m:+.4f} [95% paired t: {m-h:+.4f}, {m+h:+.4f}] per seed {np.round(diff,4).tolist()}")


for folder in sys.argv[1:]:
    table(folder, lambda k: k.startswith("fedavg") or "mu=0.0" in k)
