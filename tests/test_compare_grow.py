"""A comparison's defaults are its first trial and its folder grows: more confirm seeds or a larger budget on a
folder adds only the missing runs (the design continues: the same trials as a comparison run straight with those
settings), anything else that differs from its protocol.json is refused in one line naming the setting, a confirm
run a new choice made stale is moved aside, and the report says per method what it tuned and flags a choice that
confirms worse than its defaults. End to end on folders real comparisons wrote (bundled digits)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from fedagg.compare.growth import refusal, set_aside_stale
from fedagg.compare.protocol import make_protocol
from fedagg.compare.space import Param
from fedagg.compare.verdict import method_table, worse_than_defaults
from fedagg.config.constraints import Tune

pytest.importorskip("optuna")

DESIGN = "defaults, then scrambled Sobol points"


def record(**change):
    protocol = dict(methods=["fedavg", "fedprox"], budget=4, tune_seeds=[0], confirm_seeds=[1, 2, 3], baseline="fedavg",
                    val_frac=0.1, batch=1, sampler_seed=0, validation="split", held_out=0.2)
    arguments = change.pop("arguments", ["rounds=10", "num_clients=50"])
    design = change.pop("design", DESIGN)
    return {"protocol": {**protocol, **change}, "arguments": arguments, "design": design}


WHERE = "hydra.sweep.dir=out"


@pytest.mark.parametrize("here, line", [
    (record(tune_seeds=[0, 1]), f"{WHERE} holds a comparison with tune_seeds=[0] (protocol.json), not tune_seeds=[0,1]; "
                                "nothing was changed: rerun with tune_seeds=[0], or give another hydra.sweep.dir"),
    (record(methods=["fedavg"]), f"{WHERE} holds a comparison with methods=[fedavg,fedprox] (protocol.json), not "
                                 "methods=[fedavg]; nothing was changed: rerun with methods=[fedavg,fedprox], or give "
                                 "another hydra.sweep.dir"),
    (record(sampler_seed=1), f"{WHERE} holds a comparison with sampler_seed=0 (protocol.json), not sampler_seed=1; "
                             "nothing was changed: rerun with sampler_seed=0, or give another hydra.sweep.dir"),
    (record(budget=3), f"budget=3 is below the 4 trials per method {WHERE} holds (protocol.json); a comparison grows, "
                       "it does not shrink: give budget=4 or more, or another hydra.sweep.dir"),
    (record(confirm_seeds=[1, 2]), f"confirm_seeds=[1,2] leaves out seed 3 of the confirm seeds [1,2,3] {WHERE} holds "
                                   "(protocol.json); a comparison grows, it does not shrink: give confirm_seeds=3 or "
                                   "more, or a list holding those seeds"),
    (record(arguments=["rounds=20", "num_clients=50"]),
     f"{WHERE} holds a comparison with other run settings (protocol.json: rounds=10 there, rounds=20 here); nothing "
     "was changed: rerun with its settings, or give another hydra.sweep.dir"),
    (record(design="x"), f"{WHERE} holds a comparison whose trials were chosen another way (protocol.json has "
                         f"design='{DESIGN}', this version tunes with 'x'); nothing was changed: give another "
                         "hydra.sweep.dir"),
])
def test_a_folder_refuses_a_setting_that_differs_naming_it(here, line):
    assert refusal(record(), here, Path("out")) == line


def test_a_folder_grows_by_budget_and_confirm_seeds_and_ignores_the_batch():
    for grown in (record(), record(budget=8), record(confirm_seeds=[1, 2, 3, 4, 5, 6]), record(batch=4),
                  record(budget=8, confirm_seeds=[1, 2, 3, 7])):
        assert refusal(record(), grown, Path("out")) is None
    # confirm_seeds=6 on a folder confirmed on 3 seeds: the count's seeds extend the folder's
    assert make_protocol(["fedavg"], 4, [0], 6, None, 0.1, 1, 0).confirm_seeds == (1, 2, 3, 4, 5, 6)


def confirm_run(folder: Path, lr: float) -> None:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"status": "completed", "config": {"client": {"lr": lr}}}))


def test_confirm_runs_of_an_earlier_choice_are_moved_aside_not_lost(tmp_path):
    confirm_run(tmp_path / "confirm" / "tuned" / "fedavg" / "s1", 0.05)
    confirm_run(tmp_path / "confirm" / "tuned" / "fedavg" / "s2", 0.05)
    assert set_aside_stale(tmp_path, "fedavg", {"client.lr": 0.05}) is None  # the same choice: they stay
    assert set_aside_stale(tmp_path, "fedavg", {"client.lr": 0.2}) == tmp_path / "superseded" / "tuned-fedavg-0"
    assert not (tmp_path / "confirm" / "tuned" / "fedavg").exists()
    assert sorted(p.name for p in (tmp_path / "superseded" / "tuned-fedavg-0").iterdir()) == ["s1", "s2"]
    confirm_run(tmp_path / "confirm" / "tuned" / "fedavg" / "s1", 0.2)
    assert set_aside_stale(tmp_path, "fedavg", {"client.lr": 0.4}) == tmp_path / "superseded" / "tuned-fedavg-1"


def test_the_method_table_gives_dimensions_budget_and_flags_a_choice_worse_than_its_defaults():
    protocol = make_protocol(["fedavg", "fedprox", "moon"], 4, [0], [1, 2], None, 0.1, 1, 0)
    lr, mu = Param("client.lr", Tune(1e-3, 3.0, log=True), 0.05), Param("client.objective.mu", Tune(1e-3, 1.0), 0.01)
    spaces = {"fedavg": [lr], "fedprox": [lr, mu], "moon": [Param("client.lr", lr.tune, 0.1, fixed=True)]}
    selection = [{"method": "fedavg", "trial": 0, "params": {}, "val_score": 0.80, "chosen": False},
                 {"method": "fedavg", "trial": 1, "params": {}, "val_score": 0.85, "chosen": True},
                 {"method": "fedprox", "trial": 0, "params": {}, "val_score": 0.90, "chosen": True},
                 {"method": "fedprox", "trial": 1, "params": {}, "val_score": 0.70, "chosen": False},
                 {"method": "moon", "trial": 0, "params": {}, "val_score": 0.60, "chosen": True}]
    done = lambda *v: {s: ("completed", x) for s, x in zip((1, 2), v)}  # noqa: E731
    values = {("fedavg", "tuned"): done(0.70, 0.72), ("fedavg", "defaults"): done(0.80, 0.76),
              ("fedprox", "tuned"): done(0.50, 0.52), ("fedprox", "defaults"): done(0.60, 0.62),  # chosen: defaults
              ("moon", "tuned"): done(0.4, 0.4), ("moon", "defaults"): done(0.4, 0.4)}
    worse = worse_than_defaults(selection, values, protocol)
    assert list(worse) == ["fedavg"] and worse["fedavg"] == pytest.approx((0.71, 0.78))
    grid = method_table(selection, spaces, values, protocol, {"fedavg": "FedAvg"}).grid
    assert grid.values.tolist() == [
        ["FedAvg", "1 (client.lr)", "2 of 4", "80.00", "1", "85.00", "78.00", "71.00",
         "confirms worse than its defaults (71.00 < 78.00)"],
        ["fedprox", "2 (client.lr, client.objective.mu)", "2 of 4", "90.00", "0", "90.00", "61.00", "51.00",
         "the defaults were chosen"],
        ["moon", "0", "1 of 1", "60.00", "0", "60.00", "40.00", "40.00", "the defaults were chosen"]]


# -- on folders real comparisons wrote ------------------------------------------------
TINY = ["methods=[fedavg,fedprox]", "num_clients=6", "device=cpu"]


def compare(folder: Path, *args: str, rounds: int = 3) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "fedagg.compare", *TINY, f"rounds={rounds}", *args,
                           f"hydra.sweep.dir={folder}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def rows(folder: Path) -> list[tuple]:
    with open(folder / "selection.csv", newline="") as f:
        return [(r["method"], int(r["trial"]), json.loads(r["params"]), float(r["val_score"]), r["chosen"])
                for r in csv.DictReader(f)]


def files(folder: Path) -> dict[str, int]:
    """Every run file's modification time, by path: what a rerun rewrote."""
    return {p.relative_to(folder).as_posix(): p.stat().st_mtime_ns
            for part in ("tune", "confirm") for p in (folder / part).rglob("summary.json")}


@pytest.mark.slow  # three tiny comparisons and two refusals in subprocesses (60-120 s)
def test_a_grown_comparison_equals_one_run_straight_with_the_grown_settings(tmp_path):
    grown, straight = tmp_path / "grown", tmp_path / "straight"
    proc = compare(grown, "budget=2", "confirm_seeds=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, before = rows(grown), files(grown)
    for m, defaults in (("fedavg", {"client.lr": 0.05}), ("fedprox", {"client.lr": 0.05, "client.objective.mu": 0.01})):
        mine = [r for r in first if r[0] == m]
        assert mine[0][1:3] == (0, defaults)  # the first trial: the method's defaults
        assert max(r[3] for r in mine) >= mine[0][3] and next(r for r in mine if r[4] == "true")[3] == max(r[3] for r in mine)

    proc = compare(grown, "budget=3", "confirm_seeds=2")  # one more trial, one more confirm seed
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "budget 2 -> 3: each method's design goes on with 1 more trial(s)" in out
    assert "confirm seeds [1] -> [1,2]: 1 more confirm run(s) per configuration" in out
    after = files(grown)
    new = sorted(set(after) - set(before))
    assert new == ["confirm/default/fedavg/s2/summary.json", "confirm/default/fedprox/s2/summary.json",
                   "confirm/tuned/fedavg/s2/summary.json", "confirm/tuned/fedprox/s2/summary.json",
                   "tune/fedavg/t002/s0/summary.json", "tune/fedprox/t002/s0/summary.json"]
    assert all(after[k] == v for k, v in before.items() if not k.startswith("confirm/tuned/"))  # none ran again
    for m in ("fedavg", "fedprox"):
        k = f"confirm/tuned/{m}/s1/summary.json"
        if after[k] != before[k]:  # the new trial won: the earlier choice's run was moved aside, not lost
            assert (grown / "superseded" / f"tuned-{m}-0" / "s1" / "summary.json").exists()
    assert [r[:4] for r in rows(grown) if r[1] < 2] == [r[:4] for r in first]  # the first trials kept their scores

    proc = compare(straight, "budget=3", "confirm_seeds=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r[:3] + (r[4],) for r in rows(straight)] == [r[:3] + (r[4],) for r in rows(grown)]
    assert [r[3] for r in rows(straight)] == pytest.approx([r[3] for r in rows(grown)], abs=1e-9)
    assert sorted(files(straight)) == sorted(k for k in files(grown))
    page = (grown / "report.html").read_text()
    assert "<td>FedAvg</td><td>1 (client.lr)</td><td>3 of 3</td>" in page
    assert "<td>FedProx</td><td>2 (client.lr, client.objective.mu)</td><td>3 of 3</td>" in page

    kept = files(grown), (grown / "protocol.json").read_text()
    for args, rounds, named in ((["budget=3", "confirm_seeds=2"], 4, "rounds=3 there, rounds=4 here"),
                                (["budget=2", "confirm_seeds=2"], 3, "budget=2 is below the 3 trials per method")):
        proc = compare(grown, *args, rounds=rounds)
        assert proc.returncode == 2 and named in proc.stdout + proc.stderr
        assert (files(grown), (grown / "protocol.json").read_text()) == kept  # nothing was run or written
