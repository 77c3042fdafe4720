"""Paired statistics against scipy on fixed numbers, and make_table --baseline on hand-made runs."""

import csv
import json
import math

import numpy as np
import pytest
from scipy import stats as sp

from fedagg.results import stats, table as make_table


def test_paired_t_interval_of_the_seeds_both_have():
    method = {0: 91.0, 1: 92.5, 2: 90.0, 3: 93.0, 7: 99.0}  # seed 7 has no baseline run: not a pair
    base = {0: 90.0, 1: 91.0, 2: 90.5, 3: 91.0, 9: 10.0}
    got = stats.paired_difference(method, base)
    a, b = [91.0, 92.5, 90.0, 93.0], [90.0, 91.0, 90.5, 91.0]
    ci = sp.ttest_rel(a, b).confidence_interval(0.95)
    assert got.n == 4 and got.interval == "paired t" and got.mean == pytest.approx(np.mean(np.subtract(a, b)))
    assert (got.low, got.high) == pytest.approx((ci.low, ci.high))
    t = sp.t.ppf(0.975, 3)  # by hand: mean ± t s / sqrt(n)
    d = np.subtract(a, b)
    assert got.low == pytest.approx(d.mean() - t * d.std(ddof=1) / 2)
    assert not got.excludes_zero  # differences of 1, 1.5, -0.5 and 2 do not settle the sign


def test_bootstrap_interval_from_six_pairs():
    d = [0.8, 1.2, 0.5, 1.9, 1.1, 0.7, 1.4]
    got = stats.paired_difference({s: 90 + x for s, x in enumerate(d)}, {s: 90.0 for s in range(7)}, seed=3)
    ref = sp.bootstrap((np.array(d),), np.mean, confidence_level=0.95, n_resamples=9999, method="BCa",
                       random_state=np.random.default_rng(3)).confidence_interval
    assert got.interval == "bootstrap" and (got.low, got.high) == pytest.approx((ref.low, ref.high), abs=1e-9)
    assert got.excludes_zero and got.low > 0


def test_degenerate_pairs():
    assert stats.paired_difference({0: 1.0}, {1: 1.0}).n == 0
    one = stats.paired_difference({0: 3.0}, {0: 1.0})
    assert (one.n, one.mean, one.low) == (1, 2.0, None) and not one.excludes_zero
    same = stats.paired_difference({0: 3.0, 1: 4.0}, {0: 2.0, 1: 3.0})  # always +1: no spread
    assert (same.low, same.high) == (1.0, 1.0) and same.excludes_zero


TABLE = {"a": {"x": 90.0, "y": 80.0, "z": 70.0, "w": 60.0},
         "b": {"x": 91.0, "y": 79.0, "z": 75.0, "w": 65.0},
         "c": {"x": 85.0, "y": 80.0, "z": 60.0, "w": None}}  # c lacks w: only x, y, z count


def test_ranks_friedman_and_critical_difference_against_scipy():
    ranks, n = stats.average_ranks(TABLE)
    values = np.array([[90, 80, 70], [91, 79, 75], [85, 80, 60]], dtype=float)
    expected = sp.rankdata(-values, axis=0).mean(axis=1)  # ties share their average rank
    assert n == 3 and [ranks[m] for m in "abc"] == pytest.approx(expected.tolist())
    assert ranks["b"] == pytest.approx((1 + 3 + 1) / 3) and ranks["a"] == pytest.approx((2 + 1.5 + 2) / 3)
    chi2, p = stats.friedman(TABLE)
    ref = sp.friedmanchisquare(values[0], values[1], values[2])
    assert (chi2, p) == pytest.approx((ref.statistic, ref.pvalue))
    assert stats.friedman({"a": {"x": 1.0}, "b": {"x": 2.0}}) is None
    # Demšar (2006), Table 5: q_0.05 = 2.569 for 4 methods; CD = q sqrt(k (k + 1) / (6 N))
    assert stats.critical_difference(4, 10) == pytest.approx(2.569 * math.sqrt(20 / 60), abs=2e-3)
    assert stats.cliques([1.0, 1.5, 3.0, 3.2], cd=1.0) == [(0, 1), (2, 3)]


def write_runs(folder, results):
    """summary.json files of a sweep: results[(method, alpha)][seed] = final accuracy."""
    i = 0
    for (method, alpha), by_seed in results.items():
        for seed, acc in by_seed.items():
            d = folder / str(i)
            d.mkdir(parents=True)
            d.joinpath("summary.json").write_text(json.dumps({
                "status": "completed", "seed": seed, "final_test_acc": acc, "choices": {"aggregator": method},
                "config": {"partition": {"alpha": alpha}}}))
            i += 1


def test_make_table_baseline_section(tmp_path):
    rng = np.random.default_rng(0)
    results = {}
    for alpha in (0.1, 0.5, 1.0):
        base = rng.uniform(0.8, 0.9, 4)
        results[("fedavg", alpha)] = dict(enumerate(base))
        results[("better", alpha)] = dict(enumerate(base + 0.02 + rng.normal(0, 0.002, 4)))
        results[("noisy", alpha)] = dict(enumerate(base + rng.normal(0, 0.02, 4)))
    del results[("noisy", 1.0)][3]  # three pairs there
    write_runs(tmp_path, results)
    assert make_table.main([str(tmp_path), "--columns", "partition.alpha", "--baseline", "fedavg", "--metric", "final"]) == 0
    text = (tmp_path / "table.md").read_text()
    assert "(—" not in text  # no published numbers: no empty paper parts
    cells = {(r["method"], r["partition.alpha"]): r for r in csv.DictReader(open(tmp_path / "table.csv"))}
    for alpha in ("0.1", "0.5", "1"):
        better = cells[("better", alpha)]
        seeds = results[("better", float(alpha))]
        ref = stats.paired_difference({s: 100 * v for s, v in seeds.items()},
                                      {s: 100 * v for s, v in results[("fedavg", float(alpha))].items()})
        assert float(better["diff_to_baseline"]) == pytest.approx(ref.mean, abs=1e-5)
        assert float(better["ci_low"]) == pytest.approx(ref.low, abs=1e-5) and better["excludes_zero"] == "True"
        assert f"{ref.mean:+.2f} [{ref.low:+.2f}, {ref.high:+.2f}] *" in text
    assert cells[("noisy", "1")]["n_pairs"] == "3" and cells[("fedavg", "1")]["diff_to_baseline"] == ""
    assert "paired t interval for fewer than 6 pairs" in text and "used here: paired t" in text
    assert "| better | 1.00 |" in text  # first in every column
    assert "Friedman test over 3 columns" in text and (tmp_path / "cd_diagram.png").stat().st_size > 1000
    assert make_table.main([str(tmp_path), "--columns", "partition.alpha", "--baseline", "fedprox", "--metric", "final"]) == 2
