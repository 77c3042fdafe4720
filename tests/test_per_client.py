"""Per-client evaluation: each client's local test split, the global model's accuracy on it, and its spread."""

import csv
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from conftest import compose_config
from fedagg.loop.evaluation import per_client_accuracy, spread
from fedagg.loop.splits import make_clients
from fedagg.run import train


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_local_test_split_is_disjoint_seeded_and_leaves_the_rest_unchanged():
    parts = [torch.arange(0, 20), torch.arange(20, 70), torch.arange(70, 80)]
    cpu = torch.device("cpu")
    clients = make_clients(parts, 0.1, seed=4, device=cpu, test_frac=0.2)
    for c, p in zip(clients, parts):
        n = p.numel()
        assert (c.val_idx.numel(), c.test_idx.numel()) == (round(0.1 * n), round(0.2 * n))
        together = torch.cat([c.train_idx, c.val_idx, c.test_idx])
        assert torch.equal(together.sort().values, p)  # disjoint, and nothing lost
    again = make_clients(parts, 0.1, seed=4, device=cpu, test_frac=0.2)
    other = make_clients(parts, 0.1, seed=5, device=cpu, test_frac=0.2)
    assert all(torch.equal(a.test_idx, b.test_idx) for a, b in zip(clients, again))
    assert any(not torch.equal(a.test_idx, b.test_idx) for a, b in zip(clients, other))
    without = make_clients(parts, 0.1, seed=4, device=cpu)  # the validation split does not move
    assert all(torch.equal(a.val_idx, b.val_idx) for a, b in zip(clients, without))
    assert all(set(a.train_idx.tolist()) == set(b.train_idx.tolist()) - set(a.test_idx.tolist())
               for a, b in zip(clients, without))


class ArgmaxOfInput(nn.Module):
    def forward(self, x):
        return x


def test_per_client_accuracy_and_its_spread_by_hand():
    # 3 classes; the "model" predicts the largest input; labels make clients 3/4, 1/2 and 0/1 right
    x = torch.eye(3)[torch.tensor([0, 1, 2, 0, 1, 2, 0])]
    y = torch.tensor([0, 1, 2, 1, 1, 0, 2])
    data = SimpleNamespace(train_x=x, train_y=y, prepare=lambda t: t)
    data.train_images = lambda idx: data.train_x[idx]  # the images as clients see them (no feature noise)
    tests = [torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5]), torch.tensor([6])]
    acc = per_client_accuracy(ArgmaxOfInput(), data, tests, batch_size=3)  # batches cross client boundaries
    assert acc.tolist() == pytest.approx([0.75, 0.5, 0.0])
    s = spread(acc)
    values = np.array([0.75, 0.5, 0.0])
    assert s == pytest.approx({"client_acc_mean": values.mean(), "client_acc_std": values.std(),
                               "client_acc_p10": np.percentile(values, 10), "client_acc_min": 0.0})


def test_a_run_records_every_clients_accuracy(tmp_path):
    train(compose_config("rounds=3", "eval_every=2", "device=cpu", "eval.per_client=true", "clients_per_round=4"),
          tmp_path)
    rows, metrics = _rows(tmp_path / "clients.csv"), _rows(tmp_path / "metrics.csv")
    assert {r["round"] for r in rows} == {"2", "3"} and len(rows) == 20  # every client, every evaluated round
    for m in metrics:
        accs = np.array([float(r["test_acc"]) for r in rows if r["round"] == m["round"]])
        assert float(m["client_acc_mean"]) == pytest.approx(accs.mean())
        assert float(m["client_acc_min"]) == pytest.approx(accs.min())
    summary = json.loads((tmp_path / "summary.json").read_text())  # the last evaluation's, for make_table --metric
    assert summary["final_client_acc_p10"] == pytest.approx(float(metrics[-1]["client_acc_p10"]))
    sizes = {c["id"]: c["size"] for c in json.loads((tmp_path / "partition.json").read_text())["clients"]}
    tested = {int(r["client"]): int(r["num_test"]) for r in rows}
    trained = {int(r["client"]): int(r["num_samples"]) for r in _rows(tmp_path / "weights.csv")}
    for i, n in trained.items():  # training data = what is left after the 20% local test split
        assert tested[i] == round(0.2 * sizes[i]) and n == sizes[i] - tested[i]


@pytest.mark.parametrize("overrides, message", [
    ("client.test_frac=0.1", r"^client.test_frac=0.1 is not allowed with eval.per_client=false"),
    ("eval.per_client=true client.test_frac=0.0", r"^client.test_frac=0.0 is not allowed with eval.per_client=true"),
    ("eval.per_client=maybe", r"^eval.per_client='maybe' is not allowed"),
])
def test_inconsistent_settings_are_refused(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        train(compose_config("rounds=1", "device=cpu", *overrides.split()), tmp_path)
