"""The drivers of round loops: N loops run in step (`run_in_step`: each round `begin` on every loop, one
`train_rounds` call of the parallel engine, `end` on each) give each loop what it gets run alone (`run_alone`).

Four runs on the digits MLP that differ in what a stacked sweep varies (aggregator and its client half, seed,
stragglers, momentum and kept optimizer state, number of rounds): in step they give every file each gets alone;
a diverging run, one whose aggregation fails, one that ends early and one whose stacked round raises leave or
are retried while the others go on unchanged; a second Ctrl-C stops all of them at once, each with its last
checkpoint; a resumed loop continues in step where it stopped.
"""

import copy
import csv
import json
import time

import pytest
import torch

from conftest import compose_config
from fedagg.loop.drivers import run_alone, run_in_step
from fedagg.run import prepare, train
from fedagg.runtime.interrupts import StoppedNow, StopRequests

COMMON = ["engine=parallel", "device=cpu", "clients_per_round=6", "checkpoint_every=1", "rounds=3", "resume=true"]
RUNS = [
    ["aggregator=fedavg", "seed=0"],
    ["aggregator=scaffold", "seed=1", "system=stragglers"],
    ["aggregator=fedadam", "seed=2", "client.momentum=0.9", "client.keep_optimizer_state=true"],
    ["aggregator=fedavg", "seed=3", "rounds=2", "client.lr=0.2"],  # ends a round before the others
]
VARIABLE = {"elapsed_s", "wall_time_s", "finished_at", "group_started_at"}
# the digits MLP: each client's arithmetic is its own whichever runs share a call (tests/test_stacked_engine.py),
# so the figures are equal to the last digit; the tolerance is far below what a wrong batch, step or run moves
REL = 1e-6


def rows(path):
    with open(path) as f:
        return [{k: v for k, v in row.items() if k not in VARIABLE} for row in csv.DictReader(f)]


def close(a: str, b: str) -> bool:
    try:
        x, y = float(a), float(b)
    except ValueError:
        return a == b
    return abs(x - y) <= REL * max(1.0, abs(x), abs(y))


def assert_same_run(a, b):
    for name in ("metrics.csv", "weights.csv"):
        ra, rb = rows(a / name), rows(b / name)
        assert len(ra) == len(rb) and [r.keys() for r in ra] == [r.keys() for r in rb], name
        for x, y in zip(ra, rb):
            assert all(close(x[k], y[k]) for k in x), (name, x, y)
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    assert {k: v for k, v in sa.items() if k not in VARIABLE} == {k: v for k, v in sb.items() if k not in VARIABLE}
    ma, mb = torch.load(a / "model.pt"), torch.load(b / "model.pt")
    assert ma.keys() == mb.keys()
    for k in ma:
        assert torch.allclose(ma[k].double(), mb[k].double(), rtol=REL, atol=REL), k


def _config(k, *extra):
    return compose_config(*COMMON, *RUNS[k], *extra)


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    folder = tmp_path_factory.mktemp("alone")
    for k in range(len(RUNS)):
        assert train(_config(k), folder / str(k))["status"] == "completed"
    return folder


def _in_step(folder, configs, engine_from=0, stop=None):
    """Every config prepared, then run in step on a copy of one run's engine (as the stacked launcher does); the
    outcomes, and the order in which the loops left."""
    prepared = [prepare(cfg, folder / str(k)) for k, cfg in enumerate(configs)]
    loops = [p.loop for p in prepared]
    engine = copy.copy(loops[engine_from].fed.engine)
    order = []

    def left(k, outcome):
        order.append(k)
        if isinstance(outcome, BaseException):
            prepared[k].close()
        else:
            prepared[k].finished(outcome)

    return run_in_step(loops, engine, stop or StopRequests(), left=left), order, engine


def test_loops_in_step_give_each_loop_what_it_gets_alone(alone, tmp_path):
    outcomes, order, engine = _in_step(tmp_path, [_config(k) for k in range(len(RUNS))])
    assert [o["status"] for o in outcomes] == ["completed"] * len(RUNS)
    assert order == [3, 0, 1, 2]  # the two-round run left first
    for k in range(len(RUNS)):
        assert_same_run(tmp_path / str(k), alone / str(k))
    assert engine.chunk_size != "auto"  # resolved once, for the group


def test_each_loop_in_step_reports_its_share_of_the_group_time(tmp_path):
    """wall_time_s of a stacked run: its own begin/end plus its clients' part of each shared training call; the
    shares add up to the group's time (but the closing of each run as it left)."""
    prepared = [prepare(_config(k), tmp_path / str(k)) for k in range(len(RUNS))]
    loops = [p.loop for p in prepared]
    took = time.perf_counter()
    outcomes = run_in_step(loops, copy.copy(loops[0].fed.engine), StopRequests(),
                           left=lambda k, outcome: prepared[k].close())
    took = time.perf_counter() - took
    walls = [o["wall_time_s"] for o in outcomes]
    assert all(w > 0 for w in walls)
    assert 0.9 * took <= sum(walls) <= took, (walls, took)  # but closing each run (its lock, its tracker)
    assert len({o["group_started_at"] for o in outcomes}) == 1
    assert walls[3] < walls[0]  # two rounds of 6 clients against three


def test_a_training_call_is_charged_to_its_runs_by_their_clients():
    from types import SimpleNamespace

    from fedagg.loop.drivers import JobClock, share

    clocks = [JobClock() for _ in range(3)]
    share(10.0, {0: SimpleNamespace(clients=[1, 2, 3]), 2: SimpleNamespace(clients=[4])}, clocks)
    assert [c() for c in clocks] == [7.5, 0.0, 2.5]
    with clocks[1].running(), clocks[1].running():  # nested: counted once
        time.sleep(0.05)
    assert 0.05 <= clocks[1]() < 0.5


def test_a_loop_alone_is_a_single_run(alone, tmp_path):
    """run_alone is `train`'s driver: the same run through prepare and run_alone gives the same files."""
    with prepare(_config(1), tmp_path / "1") as run:
        summary = run_alone(run.loop)
    assert summary["status"] == "completed"
    assert_same_run(tmp_path / "1", alone / "1")


def test_a_diverging_and_a_failing_loop_leave_and_the_others_go_on(alone, tmp_path, monkeypatch):
    configs = [_config(0), _config(1, "client.lr=1e30"), _config(2), _config(3)]

    def broken(inputs):
        if inputs.round == 2:
            raise RuntimeError("broken in round 2")
        return original(inputs)

    prepared = [prepare(cfg, tmp_path / str(k)) for k, cfg in enumerate(configs)]
    loops = [p.loop for p in prepared]
    original = loops[2].fed.aggregator.aggregate
    monkeypatch.setattr(loops[2].fed.aggregator, "aggregate", broken)
    order = []
    outcomes = run_in_step(loops, copy.copy(loops[0].fed.engine), StopRequests(),
                           left=lambda k, o: (order.append(k), prepared[k].close()))
    assert outcomes[0]["status"] == "completed" and outcomes[3]["status"] == "completed"
    assert outcomes[1]["status"] == "diverged" and outcomes[1]["diverged_round"] == 1
    assert isinstance(outcomes[2], RuntimeError)
    assert order[:2] == [1, 2]  # diverged in round 1, failed in round 2
    failed = json.loads((tmp_path / "2" / "summary.json").read_text())
    assert failed["status"] == "failed" and "broken in round 2" in failed["traceback"]
    assert_same_run(tmp_path / "0", alone / "0")
    assert_same_run(tmp_path / "3", alone / "3")


def test_a_stacked_round_that_raises_is_trained_run_by_run(alone, tmp_path, monkeypatch, caplog):
    """One run's error (its data, its objective) must not fail the others: that round trains them one at a time."""
    from fedagg.engines.parallel import ParallelEngine

    real = ParallelEngine.train_rounds

    def flaky(self, jobs):
        if len(jobs) > 1 and jobs[0].round == 2:
            raise RuntimeError("a stacked call failed")
        return real(self, jobs)

    monkeypatch.setattr(ParallelEngine, "train_rounds", flaky)
    outcomes, _, _ = _in_step(tmp_path, [_config(k) for k in range(3)])
    assert [o["status"] for o in outcomes] == ["completed"] * 3
    assert "a stacked round of 3 runs failed (RuntimeError: a stacked call failed)" in caplog.text
    for k in range(3):
        assert_same_run(tmp_path / str(k), alone / str(k))


class SecondCtrlCInRound2(StopRequests):
    """A second Ctrl-C as the stacked launcher passes it on, in round 2 (after round 1's checkpoint)."""

    def __init__(self, loops):
        super().__init__()
        self.loops = loops

    def writing(self, last=False):
        if not last and self.loops[0].summary["rounds_completed"] == 2 and not self.at_once:
            self.requested = True
            self.now()
        return super().writing(last)


def test_a_second_ctrl_c_stops_every_loop_at_once_and_they_resume_in_step(alone, tmp_path):
    configs = [_config(k) for k in range(3)]
    prepared = [prepare(cfg, tmp_path / str(k)) for k, cfg in enumerate(configs)]
    loops = [p.loop for p in prepared]
    outcomes = run_in_step(loops, copy.copy(loops[0].fed.engine), SecondCtrlCInRound2(loops),
                           left=lambda k, o: prepared[k].close())
    assert all(isinstance(o, StoppedNow) for o in outcomes)
    for k in range(3):  # what resume=true continues from: round 1's checkpoint
        s = json.loads((tmp_path / str(k) / "summary.json").read_text())
        assert s["status"] == "interrupted" and s["rounds_completed"] == 1, s
        assert (tmp_path / str(k) / "checkpoint.pt").exists()
    outcomes, _, _ = _in_step(tmp_path, [_config(k) for k in range(3)])  # the same configs: resume=true
    assert [o["status"] for o in outcomes] == ["completed"] * 3
    for k in range(3):
        assert_same_run(tmp_path / str(k), alone / str(k))


def test_a_first_ctrl_c_stops_every_loop_after_its_round(tmp_path):
    stop = StopRequests()
    stop.requested = True  # as the launcher sets it on the first Ctrl-C
    outcomes, _, _ = _in_step(tmp_path, [_config(k) for k in range(2)], stop=stop)
    assert [(o["status"], o["rounds_completed"]) for o in outcomes] == [("interrupted", 1)] * 2
    for k in range(2):
        assert (tmp_path / str(k) / "checkpoint.pt").exists()
