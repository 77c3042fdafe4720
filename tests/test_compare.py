"""The fair comparison protocol's parts: search spaces read from the constructors, its one-line refusals, the
seeds, the score, the selection (validation only), the studies' exact budget and their resumption."""

import json
import math
from typing import Annotated

import numpy as np
import optuna
import pytest
from omegaconf import OmegaConf
from scipy.stats import qmc

from conftest import compose_config
from fedagg.compare import study as studies
from fedagg.compare.protocol import make_protocol, score, select, selection_csv
from fedagg.compare.space import Param, default_problem, search_space
from fedagg.config.constraints import Range, Tune
from fedagg.data.device import DeviceData
from fedagg.run import train
from hydra_plugins.fedagg_compare.compare_sweeper import CompareSweeper

LR = (1e-3, 10 ** 0.5, True)  # the client rate's one range


def space_of(*overrides):
    cfg = compose_config(*overrides)
    nodes = {g: OmegaConf.to_container(cfg[g], resolve=True) for g in ("aggregator", "client")}
    return {p.key: (p.tune.low, p.tune.high, p.tune.log) for p in search_space(nodes)}


def test_spaces_come_from_the_constructors_with_one_client_rate_range():
    assert space_of("aggregator=fedavg") == {"client.lr": LR}
    assert space_of("client/objective=fedprox") == {"client.lr": LR, "client.objective.mu": (1e-3, 1.0, True)}
    assert space_of("aggregator=fedadam") == {"aggregator.lr": (1e-3, 10.0, True), "aggregator.tau": (1e-5, 0.1, True),
                                              "client.lr": LR}
    assert space_of("aggregator=fedexp") == {"aggregator.eps": (1e-3, 0.1, True), "client.lr": LR}
    assert space_of("aggregator=fedadp") == {"aggregator.alpha": (1.0, 10.0, False), "client.lr": LR}
    assert space_of("aggregator=scaffold") == {"aggregator.lr": (0.1, 3.0, True), "client.lr": LR}
    # FedDyn's client half takes aggregator.alpha by interpolation: one key is tuned, not two
    assert space_of("aggregator=feddyn") == {"aggregator.alpha": (1e-3, 0.1, True), "client.lr": LR}


class Empty:
    def __init__(self, a: Annotated[float, Range(gt=0), Tune(1.0, 1.0)] = 1.0) -> None: ...


class NotPositive:
    def __init__(self, a: Annotated[float, Tune(0.0, 1.0, log=True)] = 1.0) -> None: ...


class Outside:
    def __init__(self, a: Annotated[float, Range(ge=0, lt=1), Tune(0.5, 1.0)] = 0.9) -> None: ...


@pytest.mark.parametrize("target, line", [
    (Empty, "search range of aggregator.a: its range [1, 1] is empty: low must be below high; correct its Tune(...) declaration"),
    (NotPositive, "search range of aggregator.a: its log range [0, 1] must be positive; correct its Tune(...) declaration"),
    (Outside, "search range of aggregator.a: its end 1 is not a value aggregator.a accepts (it must be a number in "
              "[0, 1)); correct its Tune(...) declaration"),
])
def test_an_unusable_range_is_one_line(target, line):
    node = {"_target_": f"{__name__}.{target.__name__}", "a": 1.0}
    with pytest.raises(ValueError) as err:
        search_space({"aggregator": node})
    assert str(err.value) == line


BASE = dict(methods=["fedavg"], budget=4, tune_seeds=[0], confirm_seeds=5, baseline=None, val_frac=0.1, batch=1,
            sampler_seed=0)


@pytest.mark.parametrize("change, line", [
    (dict(budget=0), "budget=0 is not allowed; it must be an integer >= 1 (trials per method)"),
    (dict(budget=2.5), "budget=2.5 is not allowed; it must be an integer >= 1 (trials per method)"),
    (dict(tune_seeds=[0, 1], confirm_seeds=[1, 2]), "confirm_seeds=[1, 2] is not allowed; seed 1 is also a tuning "
                                                    "seed (tune_seeds=[0, 1]): confirmation needs fresh seeds"),
    (dict(methods=[]), "methods=[] is not allowed; give a list of method names, e.g. methods=[fedavg,fedprox]"),
    (dict(baseline="fedprox"), "baseline='fedprox' is not allowed; choose one of the methods: fedavg"),
    (dict(val_frac=1.0), "val_frac=1.0 is not allowed; it must be a fraction in (0, 1)"),
])
def test_bad_protocol_settings_are_one_line(change, line):
    with pytest.raises(ValueError) as err:
        make_protocol(**{**BASE, **change})
    assert str(err.value) == line


def test_confirm_seeds_are_fresh():
    assert make_protocol(**{**BASE, "tune_seeds": [0, 3], "confirm_seeds": 5}).confirm_seeds == (4, 5, 6, 7, 8)
    assert make_protocol(**{**BASE, "confirm_seeds": [7, 9]}).confirm_seeds == (7, 9)


def test_score_is_the_mean_validation_accuracy_of_the_last_tenth_of_the_rounds():
    rows = [{"round": r, "val_acc": str(v)} for r, v in enumerate([0.1, 0.9, 0.2, 0.4, 0.6], 1)]
    assert score(rows, rounds=5, status="completed") == pytest.approx(0.6)  # ceil(5/10) = 1: the last round only
    assert score(rows, rounds=11, status="completed") == pytest.approx(0.5)  # ceil(11/10) = 2: (0.4 + 0.6) / 2
    assert score(rows, rounds=30, status="completed") == pytest.approx((0.2 + 0.4 + 0.6) / 3)
    assert score(rows[:2], rounds=5, status="diverged") == 0.0


def fake_trial(folder, val, test):
    """A finished trial run whose validation and test accuracies per round are given."""
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"status": "completed", "config": {"rounds": len(val)}}))
    lines = ["round,test_acc,val_acc"] + [f"{r},{t},{v}" for r, (t, v) in enumerate(zip(test, val), 1)]
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_selection_follows_validation_when_the_test_ranking_disagrees(tmp_path):
    # trial 0: better on validation, worse on test; trial 1 the other way round; a last-round peak (trial 2) on
    # validation does not win over a better mean of the last ceil(R/10) = 2 rounds
    fake_trial(tmp_path / "t0", val=[0.5] * 9 + [0.80, 0.80], test=[0.5] * 9 + [0.60, 0.60])
    fake_trial(tmp_path / "t1", val=[0.5] * 9 + [0.70, 0.70], test=[0.5] * 9 + [0.95, 0.95])
    fake_trial(tmp_path / "t2", val=[0.5] * 9 + [0.50, 0.85], test=[0.5] * 9 + [0.90, 0.90])
    trials = [{"trial": n, "params": {}, "val_score": CompareSweeper.trial_score(tmp_path / f"t{n}")} for n in range(3)]
    assert [round(t["val_score"], 6) for t in trials] == [0.8, 0.7, 0.675]
    assert select(trials)["trial"] == 0
    assert select([{"trial": 0, "val_score": 0.5}, {"trial": 1, "val_score": 0.5}])["trial"] == 0  # ties: the earlier


SPACE2 = [Param("aggregator.tau", Tune(1e-5, 0.1, log=True), 1e-3), Param("client.lr", Tune(1e-3, 3.0, log=True), 0.05)]
SPACE1 = [Param("client.lr", Tune(1e-3, 10.0, log=True), 0.05)]


def drive(path, space, budget, batch, kill_after=None):
    """Run a study to its end with a made-up objective; `kill_after` trials told, drop the study object (a kill)
    and go on with a new one on the same file. Returns every (number, values, score) told, in order."""
    told, study = [], studies.open_study(path, "m")
    while True:
        asked = studies.next_trials(study, space, budget, batch, seed=3)
        if not asked:
            return told
        for number, values in asked:
            if kill_after is not None and len(told) == kill_after:
                kill_after, study = None, studies.open_study(path, "m")  # this one's asked trial stays open
                break
            value = -sum((math.log10(v) + 1.5) ** 2 for v in values.values())
            studies.tell(study, number, value)
            told.append((number, values, value))


def sobol(d, n, seed):
    """The first n points of scipy's scrambled Sobol sequence in d dimensions for this seed (a Generator)."""
    return qmc.Sobol(d, scramble=True, seed=np.random.default_rng(seed)).random_base2(math.ceil(math.log2(n)))[:n]


def in_range(u, low, high):
    """The value at share u of a log range, 6 significant digits."""
    return float(f"{10 ** (math.log10(low) + u * (math.log10(high) - math.log10(low))):.6g}")


def expected_trials(space, n, seed):
    """Trial 0: the defaults; trial k >= 1: Sobol point k-1 mapped into each (log) range."""
    ranges = [(p.tune.low, p.tune.high) for p in space]
    return [{p.key: p.default for p in space}] + [
        {p.key: in_range(u, *r) for p, u, r in zip(space, row, ranges)} for row in sobol(len(space), n - 1, seed)]


@pytest.mark.parametrize("kill_after", [None, 1, 3])
@pytest.mark.parametrize("space", [SPACE1, SPACE2], ids=["1d", "2d"])
def test_each_method_gets_exactly_its_budget_and_a_resumed_study_asks_the_same(tmp_path, space, kill_after):
    # in memory (SQLite costs seconds here); the kill is a new study object on the same storage, as in a new process;
    # killed after 1 or 3 told trials: inside the first and the second wave of 2
    straight = drive(optuna.storages.InMemoryStorage(), space, budget=5, batch=2)
    resumed_storage = optuna.storages.InMemoryStorage()
    resumed = drive(resumed_storage, space, budget=5, batch=2, kill_after=kill_after)
    assert [n for n, _, _ in straight] == list(range(5))
    assert resumed == straight
    assert len(studies.finished(studies.open_study(resumed_storage, "m"))) == 5
    assert [v for _, v, _ in straight] == expected_trials(space, 5, seed=3)


def test_a_grown_budget_continues_the_design_and_waves_change_nothing():
    storage = optuna.storages.InMemoryStorage()
    four = drive(storage, SPACE2, budget=4, batch=1)
    eight = drive(storage, SPACE2, budget=8, batch=3)  # the same study, a larger budget: only the new trials
    straight = drive(optuna.storages.InMemoryStorage(), SPACE2, budget=8, batch=2)
    assert [n for n, _, _ in eight] == [4, 5, 6, 7]
    assert four + eight == straight
    assert [v for _, v, _ in straight] == expected_trials(SPACE2, 8, seed=3)
    assert studies.next_trials(studies.open_study(storage, "m"), SPACE2, 8, 1, seed=3) == []  # nothing left


def compose_space(*overrides):
    cfg = compose_config(*overrides)
    return search_space({g: OmegaConf.to_container(cfg[g], resolve=True) for g in ("aggregator", "client")})


def first_trials(space, budget, n, seed=0):
    study = studies.open_study(optuna.storages.InMemoryStorage(), "m")
    out = []
    while len(out) < n:
        for number, values in studies.next_trials(study, space, budget, 1, seed):
            studies.tell(study, number, 0.5)
            out.append(values)
    return out


def unit(space, values):
    """Where each value lies in its range, as a share of the range (log or linear), all trials in one list."""
    f = {True: math.log, False: float}
    return [(f[p.tune.log](v[p.key]) - f[p.tune.log](p.tune.low)) / (f[p.tune.log](p.tune.high) - f[p.tune.log](p.tune.low))
            for v in values for p in space]


def test_every_method_starts_from_its_defaults_then_the_same_unit_points_in_its_own_ranges():
    fedavg, fedntd = compose_space("aggregator=fedavg"), compose_space("client/objective=fedntd")
    moon = compose_space("client/objective=moon")
    assert [(p.key, p.default) for p in fedavg] == [("client.lr", 0.05)]  # conf/client/sgd.yaml
    a, b, c = (first_trials(space, budget=4, n=4) for space in (fedavg, fedntd, moon))
    assert a[0] == {"client.lr": 0.05}  # FedAvg's four trials: its default, then three Sobol points
    assert b[0] == {p.key: p.default for p in fedntd} and c[0] == {p.key: p.default for p in moon}
    assert len(fedntd) == len(moon) == 3  # as many dimensions: the same points of the unit cube, each in its ranges
    assert unit(fedntd, b[1:]) == pytest.approx(unit(moon, c[1:]), abs=1e-5)
    assert unit(fedntd, b[1:]) == pytest.approx(sobol(3, 3, seed=0).ravel(), abs=1e-5)
    assert unit(fedavg, a[1:]) == pytest.approx(sobol(1, 3, seed=0).ravel(), abs=1e-5)
    assert first_trials(fedavg, budget=4, n=4, seed=1)[1:] != a[1:]  # sampler_seed moves the design
    assert default_problem(Param("client.lr", Tune(1.0, 10.0), None)) == "its default None is not a number"


@pytest.mark.parametrize("budget", [5, 16])
def test_the_four_trials_after_the_defaults_cover_each_quarter_of_every_range(budget):
    space = compose_space("client/objective=fedprox")
    assert [p.key for p in space] == ["client.lr", "client.objective.mu"]
    trials = first_trials(space, budget, n=5)[1:]
    ranges = {"client.lr": (1e-3, 10 ** 0.5), "client.objective.mu": (1e-3, 1.0)}
    for key, (low, high) in ranges.items():
        quarters = [math.floor(4 * math.log(t[key] / low) / math.log(high / low)) for t in trials]
        assert sorted(quarters) == [0, 1, 2, 3], (key, [t[key] for t in trials])
    assert trials == [{k: in_range(u, *ranges[k]) for k, u in zip(ranges, row)} for row in sobol(2, 4, seed=0)]


def test_selection_csv_has_one_row_per_trial():
    text = selection_csv([{"method": "fedavg", "trial": 0, "params": {"client.lr": 0.1}, "val_score": 0.5, "chosen": True}])
    assert text == 'method,trial,params,val_score,chosen\nfedavg,0,"{""client.lr"": 0.1}",0.5,true\n'


def test_a_validation_run_never_reads_the_test_set(tmp_path, monkeypatch):
    asked = []
    original = DeviceData.eval_batches

    def recorded(self, idx, batch_size, split="test"):
        asked.append((split, None if idx is None else idx.numel()))
        return original(self, idx, batch_size, split)

    monkeypatch.setattr(DeviceData, "eval_batches", recorded)
    summary = train(compose_config("rounds=1", "device=cpu", "eval.split=val", "client.val_frac=0.2"), tmp_path)
    pooled = sum(round(0.2 * c["size"]) for c in json.loads((tmp_path / "partition.json").read_text())["clients"])
    assert asked == [("val", pooled)]
    assert summary["final_test_acc"] is None and 0 < summary["final_val_acc"] <= 1
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert all(row.split(",")[header.index("test_acc")] == "" for row in lines[1:])
    assert float(lines[1].split(",")[header.index("val_acc")]) == summary["final_val_acc"]


def test_held_out_clients_are_never_sampled_and_are_the_same_for_every_method():
    from fedagg.config.settings import Settings
    from fedagg.sampling.pool import sample_clients
    s = Settings(seed=0, num_clients=10, clients_per_round=4, held_out=0.2)
    held = s.held_out_ids
    assert len(held) == 2 and held == Settings(seed=0, num_clients=10, held_out=0.2).held_out_ids
    seen = {c for r in range(1, 40) for c in sample_clients(s, r)}
    assert seen == set(range(10)) - set(held)
    everyone = Settings(seed=0, num_clients=10, held_out=0.2)
    assert sample_clients(everyone, 1) == sorted(set(range(10)) - set(held))
    with pytest.raises(ValueError) as err:
        Settings(seed=0, num_clients=10, clients_per_round=9, held_out=0.2)
    assert str(err.value) == ("clients_per_round=9 is not allowed; it must be at most the 8 clients "
                              "eval.held_out_clients=0.2 leaves to train")
    assert make_protocol(**{**BASE, "validation": "clients", "held_out": 0.25}).run_keys(False) == \
        ["eval.held_out_clients=0.25"]
    assert make_protocol(**BASE).run_keys(False) == ["client.val_frac=0.1"] and make_protocol(**BASE).run_keys(True) == []
