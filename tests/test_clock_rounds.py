"""Synchronous rounds on the simulated clock: round lengths, deadlines, over-selection, totals, resume."""

import csv
import json
import math

import pytest

from conftest import compose_config
from fedagg.config.settings import Settings
from fedagg.sampling.pool import sample_clients
from fedagg.loop.timing import RoundTimes
from fedagg.run import train
from fedagg.system.clock import LogNormal, TimedClock
from stopping import stopped_in_round_2


class FixedClock(TimedClock):
    """Per-step times given by hand."""

    def __init__(self, times, deadline=None, over_select=0.0, upload_rate=None):
        super().__init__(upload_rate=upload_rate, deadline=deadline, over_select=over_select)
        self.given = times

    def quantile(self, u):
        raise AssertionError("not drawn")

    def connect(self, seed, num_clients):
        self.seed, self.times = seed, dict(self.given)


def _times(deadline=None, upload_rate=None):
    clock = FixedClock({3: 1.0, 5: 2.0, 7: 0.5}, deadline=deadline, upload_rate=upload_rate)
    clock.connect(0, 10)
    return RoundTimes(clock)


def test_a_round_lasts_until_its_last_arrival():
    # arrivals: 2 · 1.0 = 2, 4 · 2.0 = 8, 6 · 0.5 = 3
    timed = _times().cut(1, sampled=3, ids=[3, 5, 7], budgets=[2, 4, 6], full=[9, 9, 9], bits_up=[0, 0, 0])
    assert (timed.ids, timed.budgets, timed.seconds, timed.late) == ([3, 5, 7], [2, 4, 6], 8.0, 0)
    # no budgets: every client its full steps, 9 · 2.0 = 18
    assert _times().cut(1, 3, [3, 5, 7], None, [9, 9, 9], [0, 0, 0]).seconds == 18.0
    # uploads: 1000 bits at 500 bits/s add 2 s to each arrival
    assert _times(upload_rate=500).cut(1, 3, [3, 5, 7], [2, 4, 6], [9, 9, 9], [1000] * 3).seconds == 10.0


def test_a_deadline_drops_late_clients_before_they_train():
    timed = _times(deadline=5.0).cut(1, sampled=3, ids=[3, 5, 7], budgets=[2, 4, 6], full=[9, 9, 9],
                                     bits_up=[0, 0, 0])
    assert (timed.ids, timed.budgets, timed.seconds, timed.late) == ([3, 7], [2, 6], 5.0, 1)  # 8 > 5: client 5 late
    # everyone in time: the round ends at the last arrival, not the deadline
    timed = _times(deadline=10.0).cut(1, 3, [3, 5, 7], [2, 4, 6], [9, 9, 9], [0, 0, 0])
    assert (timed.ids, timed.seconds, timed.late) == ([3, 5, 7], 8.0, 0)
    # a client arriving exactly at the deadline is in time
    assert _times(deadline=8.0).cut(1, 3, [3, 5, 7], [2, 4, 6], [9, 9, 9], [0, 0, 0]).late == 0
    # a sampled client that never reports (4 sampled, 3 report): the server waits until the deadline
    timed = _times(deadline=10.0).cut(1, 4, [3, 5, 7], [2, 4, 6], [9, 9, 9], [0, 0, 0])
    assert (timed.seconds, timed.late) == (10.0, 0)
    # nobody in time: an empty round of the deadline's length
    timed = _times(deadline=1.0).cut(1, 3, [3, 5, 7], [2, 4, 6], [9, 9, 9], [0, 0, 0])
    assert (timed.ids, timed.seconds, timed.late) == ([], 1.0, 3)


def test_totals_add_up_and_resume():
    times = _times(deadline=5.0)
    row = times.add(times.cut(1, 3, [3, 5, 7], [2, 4, 6], [9, 9, 9], [0, 0, 0]), aggregated=2)
    assert row == {"sim_time": 5.0, "client_updates": 2, "clients_late": 1}
    row = times.add(times.cut(2, 2, [3, 7], [1, 2], [9, 9], [0, 0]), aggregated=2)  # arrivals 1, 1
    assert row == {"sim_time": 6.0, "client_updates": 4, "clients_late": 0}
    again = _times(deadline=5.0)
    again.load_state_dict(times.state_dict())
    assert again.summary() == {"final_sim_time": 6.0, "client_updates": 4, "clients_late": 1}


def test_over_selection_samples_more_and_keeps_the_first_k_of_the_stream():
    settings = Settings(seed=3, num_clients=20, clients_per_round=6)
    clock = LogNormal(deadline=5.0, over_select=0.5)
    plain, more = sample_clients(settings, 4), sample_clients(settings, 4, count=clock.selected(6))
    assert len(plain) == 6 and len(more) == 9 and set(plain) <= set(more)  # the same stream, 3 more drawn


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def _per_round(rows):
    out = {}
    for row in rows:
        out.setdefault(int(row["round"]), []).append(row)
    return out


def test_a_run_without_a_deadline_adds_each_rounds_slowest_client(tmp_path):
    # clock=uniform with min = mean = 1: every client takes 1 s per step; uploads at 1e6 bits/s
    summary = train(compose_config("rounds=4", "device=cpu", "clients_per_round=4", "system=stragglers",
                                   "clock=uniform", "clock.min=1.0", "clock.mean=1.0", "clock.upload_rate=1000000.0",
                                   "target_acc=0.3"), tmp_path)
    metrics, weights = _rows(tmp_path / "metrics.csv"), _per_round(_rows(tmp_path / "weights.csv"))
    up_each = int(metrics[0]["bits_up"]) / int(metrics[0]["clients"])
    expected, updates = 0.0, 0
    for row in metrics:
        r = int(row["round"])
        expected += max(int(w["local_steps"]) for w in weights[r]) + up_each / 1e6
        updates += len(weights[r])
        assert float(row["sim_time"]) == pytest.approx(expected)
        assert int(row["client_updates"]) == updates
    assert "clients_late" not in metrics[0]  # no deadline
    assert summary["final_sim_time"] == pytest.approx(expected) and summary["client_updates"] == updates
    first = next(row for row in metrics if float(row["test_acc"]) >= 0.3)
    assert summary["rounds_to_target"] == int(first["round"])
    assert summary["time_to_target"] == pytest.approx(float(first["sim_time"]))


def test_a_deadline_keeps_the_clients_that_arrive_in_time(tmp_path):
    overrides = ["rounds=3", "device=cpu", "clients_per_round=4", "clock=lognormal", "clock.deadline=12.0",
                 "clock.over_select=0.5", "seed=2"]
    summary = train(compose_config(*overrides), tmp_path)
    clock = LogNormal(deadline=12.0, over_select=0.5)
    clock.connect(2, 10)
    # two local epochs of batches of 32 (conf/client/sgd.yaml)
    steps = {c["id"]: 2 * -(-c["size"] // 32) for c in json.loads((tmp_path / "partition.json").read_text())["clients"]}
    metrics, weights = _rows(tmp_path / "metrics.csv"), _per_round(_rows(tmp_path / "weights.csv"))
    settings, total, late_total = Settings(seed=2, num_clients=10, clients_per_round=4), 0.0, 0
    for row in metrics:
        r = int(row["round"])
        sampled = sample_clients(settings, r, count=6)  # ⌈1.5 · 4⌉
        arrive = {i: steps[i] * clock.step_time(i) for i in sampled}
        kept = sorted(i for i, t in arrive.items() if t <= 12.0)
        assert sorted(int(w["client"]) for w in weights.get(r, [])) == kept
        assert int(row["clients_late"]) == len(sampled) - len(kept)
        total += 12.0 if len(kept) < len(sampled) else max(arrive.values())
        late_total += len(sampled) - len(kept)
        assert float(row["sim_time"]) == pytest.approx(total)
    assert late_total > 0  # the deadline cut someone: the test checks a cut, not only its absence
    assert summary["clients_late"] == late_total


def test_resume_continues_the_simulated_time(tmp_path):
    overrides = ["rounds=4", "device=cpu", "checkpoint_every=1", "clients_per_round=4", "clock=lognormal",
                 "clock.jitter=0.5", "clock.deadline=15.0", "clock.over_select=0.25",
                 "aggregator._target_=stopping.StopInRound2"]
    reference = train(compose_config(*overrides), tmp_path / "reference")
    stopped = stopped_in_round_2(train, compose_config(*overrides), tmp_path / "run")
    assert stopped["status"] == "interrupted" and stopped["rounds_completed"] == 2
    resumed = train(compose_config(*overrides, "resume=true"), tmp_path / "run")
    columns = lambda path: [(r["round"], r["sim_time"], r["client_updates"], r["clients_late"])  # noqa: E731
                            for r in _rows(path / "metrics.csv")]
    assert columns(tmp_path / "run") == columns(tmp_path / "reference")
    assert len(columns(tmp_path / "run")) == 4
    assert resumed["final_sim_time"] == reference["final_sim_time"] > 0
    assert resumed["client_updates"] == reference["client_updates"]


def test_no_clock_writes_no_time_columns(tmp_path):
    summary = train(compose_config("rounds=2", "device=cpu", "target_acc=0.3"), tmp_path)
    header = _rows(tmp_path / "metrics.csv")[0]
    assert not {"sim_time", "client_updates", "clients_late"} & set(header)
    assert not {"final_sim_time", "time_to_target", "client_updates"} & set(summary)
    assert math.isfinite(summary["final_test_acc"])
