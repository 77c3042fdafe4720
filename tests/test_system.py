"""The `system` group: stragglers, dropouts and availability, from their own seeded streams."""

import csv
import json
import logging

import pytest
import torch

from conftest import compose_config
from fedagg.seeding import generator
from fedagg.config.settings import Settings
from fedagg.sampling.pool import sample_clients
from fedagg.run import train
from fedagg.system.availability import Availability
from fedagg.system.stragglers import Stragglers


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def _by_round(rows):
    out = {}
    for row in rows:
        out.setdefault(int(row["round"]), []).append(row)
    return out


def _full_steps(run_dir, epochs=2, batch=32):
    sizes = {c["id"]: c["size"] for c in json.loads((run_dir / "partition.json").read_text())["clients"]}
    return {i: epochs * -(-n // batch) for i, n in sizes.items()}


def test_stragglers_draw_a_fraction_of_the_clients_and_uniform_budgets():
    ids, full = list(range(20)), [10] * 20
    budgets = Stragglers(0.5).budgets(seed=3, round=7, ids=ids, full=full)
    g = generator(3, "stragglers", 7)  # the stream: which clients lag, then one uniform draw per client
    lagging = set(torch.randperm(20, generator=g)[:10].tolist())
    u = torch.rand(20, generator=g)
    assert budgets == [1 + int(u[k] * 10) if k in lagging else 10 for k in ids]
    assert budgets == Stragglers(0.5).budgets(seed=3, round=7, ids=ids, full=full)  # a stream, not a state
    assert budgets != Stragglers(0.5).budgets(seed=3, round=8, ids=ids, full=full)
    many = Stragglers(1.0).budgets(seed=0, round=1, ids=list(range(5000)), full=[10] * 5000)
    counts = torch.bincount(torch.tensor(many), minlength=11)[1:]
    assert counts.min() > 400 and counts.max() < 600  # uniform over 1..10: 500 each
    assert Stragglers(0.0).budgets(seed=0, round=1, ids=ids, full=full) == full


def test_stragglers_in_a_run_are_the_same_for_two_aggregators_and_recorded(tmp_path):
    runs = {}
    for agg in ("fedavg", "fednova"):
        train(compose_config("rounds=3", "device=cpu", "clients_per_round=6", "system=stragglers", f"aggregator={agg}"),
              tmp_path / agg)
        runs[agg] = _rows(tmp_path / agg / "weights.csv")
    steps = lambda rows: [(r["round"], r["client"], r["local_steps"]) for r in rows]  # noqa: E731
    assert steps(runs["fedavg"]) == steps(runs["fednova"])  # paired: the same clients lag by the same amount
    full = _full_steps(tmp_path / "fedavg")
    for r, rows in _by_round(runs["fedavg"]).items():
        short = [row for row in rows if int(row["local_steps"]) < full[int(row["client"])]]
        assert len(short) <= 3 and all(1 <= int(row["local_steps"]) for row in rows)
        expected = Stragglers(0.5).budgets(0, r, [int(x["client"]) for x in rows], [full[int(x["client"])] for x in rows])
        assert [int(x["local_steps"]) for x in rows] == expected
    assert any(int(row["local_steps"]) < full[int(row["client"])] for row in runs["fedavg"])


def test_stragglers_give_the_same_models_in_both_engines(tmp_path):
    for engine in ("sequential", "parallel"):
        train(compose_config("rounds=2", "device=cpu", "system=stragglers", "client.momentum=0.5", f"engine={engine}"),
              tmp_path / engine)
    a, b = (_rows(tmp_path / e / "weights.csv") for e in ("sequential", "parallel"))
    assert [(r["client"], r["local_steps"]) for r in a] == [(r["client"], r["local_steps"]) for r in b]
    ma, mb = (torch.load(tmp_path / e / "model.pt") for e in ("sequential", "parallel"))
    for key in ma:
        assert float((ma[key] - mb[key]).norm() / ma[key].norm().clamp(min=1e-12)) < 1e-4, key


def test_dropout_aggregates_the_clients_that_report(tmp_path):
    train(compose_config("rounds=4", "device=cpu", "system=dropout", "system.p=0.5"), tmp_path)
    rows = _by_round(_rows(tmp_path / "weights.csv"))
    for r in range(1, 5):
        draws = torch.rand(10, generator=generator(0, "dropout", r))
        expected = [i for i in range(10) if draws[i] >= 0.5]
        assert [int(x["client"]) for x in rows.get(r, [])] == expected
        if expected:
            assert sum(float(x["weight"]) for x in rows[r]) == pytest.approx(1.0, abs=1e-6)
    assert 0 < sum(len(v) for v in rows.values()) < 40  # some reported, some did not


def test_a_round_where_nobody_reports_keeps_the_global_model(tmp_path, caplog):
    cfg = compose_config("rounds=8", "device=cpu", "system=dropout", "system.p=0.5", "clients_per_round=1")
    with caplog.at_level(logging.WARNING):
        summary = train(cfg, tmp_path)
    assert summary["status"] == "completed"
    reported = {int(r["round"]) for r in _rows(tmp_path / "weights.csv")}
    empty = [r for r in range(1, 9) if r not in reported]
    assert empty == [1, 4, 7]  # the rounds whose one draw of the dropout stream (seed 0) fell below 0.5
    metrics = {int(r["round"]): r for r in _rows(tmp_path / "metrics.csv")}
    for r in empty:
        assert f"round {r}: no client reported; the global model is kept" in caplog.text
        assert metrics[r]["clients"] == "0" and metrics[r]["train_loss"] == "" and float(metrics[r]["update_norm"]) == 0
        if r > 1:  # the model was kept, so it scores what it scored a round before
            assert metrics[r]["test_acc"] == metrics[r - 1]["test_acc"]
    # the one sampled client was sent the model (4810 32-bit parameters) every round, and sent it back in 5 of 8
    model = 32 * 4810
    assert [(int(metrics[r]["bits_down"]), int(metrics[r]["bits_up"])) for r in (1, 2)] == [(model, 0), (model, model)]
    assert (int(metrics[8]["bits_down_total"]), int(metrics[8]["bits_up_total"])) == (8 * model, 5 * model)


def test_availability_samples_only_among_online_clients(tmp_path):
    system = Availability(a=2.0, b=2.0)
    rates = system.rates(seed=0, num_clients=10)
    assert torch.equal(rates, Availability().rates(0, 10)) and not torch.equal(rates, system.rates(1, 10))
    assert bool(((rates > 0) & (rates < 1)).all())
    train(compose_config("rounds=5", "device=cpu", "system=availability", "clients_per_round=3"), tmp_path / "partial")
    train(compose_config("rounds=5", "device=cpu", "system=availability"), tmp_path / "all")
    partial = _by_round(_rows(tmp_path / "partial" / "weights.csv"))
    everyone = _by_round(_rows(tmp_path / "all" / "weights.csv"))
    settings = Settings(seed=0, num_clients=10, clients_per_round=3)
    for r in range(1, 6):
        online = system.online(0, r, 10)
        assert [int(x["client"]) for x in everyone.get(r, [])] == online.nonzero().view(-1).tolist()
        assert [int(x["client"]) for x in partial.get(r, [])] == sample_clients(settings, r, online)
        assert set(sample_clients(settings, r, online)) <= set(online.nonzero().view(-1).tolist())
    sizes = {len(v) for v in everyone.values()}
    assert len(sizes) > 1  # who is online changes from round to round


def test_over_many_rounds_availability_follows_each_clients_rate():
    system = Availability(a=0.5, b=0.5)  # U-shaped: some clients nearly always online, some nearly never
    rates = system.rates(0, 8)
    seen = torch.stack([system.online(0, r, 8) for r in range(1, 2001)]).float().mean(0)
    assert torch.allclose(seen, rates, atol=0.04)
