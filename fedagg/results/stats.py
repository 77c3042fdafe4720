"""Paired statistics over seeds: the difference to a baseline with a 95% interval, ranks, Friedman, CD diagram.

For one seed every method of a fedagg sweep sees the same partition, client samples,
batches and initial model (separate seeded streams), so two methods' results for the
same seed form a pair, and the seed-to-seed variation they share cancels in the
difference. The interval of the mean paired difference is a paired t interval for fewer
than six pairs and a BCa bootstrap interval (seeded, 9,999 resamples) from six on. Across
a table, each method is ranked in every column; the Friedman test asks whether the ranks
differ at all, and the critical difference (Nemenyi, Demšar 2006) says which average ranks
are farther apart than chance would put them. The tests are scipy's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

BOOTSTRAP_FROM = 6  # pairs; fewer get a paired t interval
CONFIDENCE = 0.95


@dataclass(frozen=True)
class PairedDifference:
    n: int  # pairs: seeds both methods have
    mean: float | None
    low: float | None
    high: float | None
    interval: str  # "paired t", "bootstrap" or "" (fewer than two pairs)

    @property
    def excludes_zero(self) -> bool:
        return self.low is not None and (self.low > 0 or self.high < 0)


def paired_difference(values: dict, baseline: dict, seed: int = 0) -> PairedDifference:
    """Mean of values[s] - baseline[s] over the seeds s both have, with its 95% interval."""
    seeds = sorted(set(values) & set(baseline), key=str)
    d = np.array([values[s] - baseline[s] for s in seeds], dtype=np.float64)
    if len(d) == 0:
        return PairedDifference(0, None, None, None, "")
    mean = float(d.mean())
    if len(d) == 1:
        return PairedDifference(1, mean, None, None, "")
    interval = "paired t" if len(d) < BOOTSTRAP_FROM else "bootstrap"
    if np.all(d == d[0]):  # no spread: every interval collapses onto the one value
        return PairedDifference(len(d), mean, mean, mean, interval)
    if len(d) < BOOTSTRAP_FROM:
        ci = stats.ttest_1samp(d, 0.0).confidence_interval(CONFIDENCE)
    else:
        ci = stats.bootstrap((d,), np.mean, confidence_level=CONFIDENCE, n_resamples=9999, method="BCa",
                             random_state=np.random.default_rng(seed)).confidence_interval
    return PairedDifference(len(d), mean, float(ci.low), float(ci.high), interval)


def complete_columns(table: dict[str, dict]) -> list:
    """The columns in which every method has a value."""
    columns = [set(v for v, x in row.items() if x is not None) for row in table.values()]
    shared = set.intersection(*columns) if columns else set()
    return sorted(shared, key=str)


def rank_definition(blocks: str) -> str:
    """The one definition of an average rank, said the same way wherever a rank is shown."""
    return (f"Average rank: in each {blocks}, every method's mean over seeds is ranked (1 = best; tied methods "
            f"share the mean of their ranks), and the ranks are averaged over the {blocks}s in which every method "
            "has a value.")


def average_ranks(table: dict[str, dict], higher_is_better: bool = True) -> tuple[dict[str, float], int]:
    """Each method's rank (1 = best, ties averaged) averaged over the columns every method has; and that count."""
    methods, columns = list(table), complete_columns(table)
    if not columns:
        return {}, 0
    values = np.array([[table[m][c] for c in columns] for m in methods], dtype=np.float64)
    ranks = stats.rankdata(-values if higher_is_better else values, axis=0)
    return dict(zip(methods, ranks.mean(axis=1).tolist())), len(columns)


def friedman(table: dict[str, dict]) -> tuple[float, float] | None:
    """(chi-square statistic, p) of the Friedman test over the complete columns; None below 3 methods or 2 columns."""
    columns = complete_columns(table)
    if len(table) < 3 or len(columns) < 2:
        return None
    result = stats.friedmanchisquare(*[[table[m][c] for c in columns] for m in table])
    return float(result.statistic), float(result.pvalue)


def critical_difference(k: int, n: int, alpha: float = 0.05) -> float:
    """Nemenyi's critical difference of average ranks for k methods over n columns."""
    q = stats.studentized_range.ppf(1 - alpha, k, np.inf) / math.sqrt(2)
    return float(q * math.sqrt(k * (k + 1) / (6 * n)))


def cd_diagram(ranks: dict[str, float], cd: float, path: Path) -> Path:
    """Demšar's diagram: methods on the rank axis (best left), a bar of length CD, and thick lines joining
    the methods whose average ranks are within CD of each other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = sorted(ranks, key=ranks.get)
    k = len(order)
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.32 * k))
    ax.set_xlim(0.5, k + 0.5)
    ax.set_ylim(-(k + 1), 2.2)
    ax.axis("off")
    ax.hlines(0, 1, k, color="black", linewidth=1)
    for r in range(1, k + 1):
        ax.vlines(r, 0, 0.15, color="black", linewidth=1)
        ax.text(r, 0.3, str(r), ha="center", fontsize=8)
    ax.hlines(1.4, 1, 1 + cd, color="black", linewidth=2)
    ax.text(1 + cd / 2, 1.6, f"CD = {cd:.2f}", ha="center", fontsize=8)
    for i, name in enumerate(order):
        y = -(i + 1) * 0.8
        ax.vlines(ranks[name], y, 0, color="grey", linewidth=0.8)
        ax.hlines(y, ranks[name], k + 0.45 if i >= k / 2 else 0.55, color="grey", linewidth=0.8)
        ax.text(k + 0.5 if i >= k / 2 else 0.5, y, f"{name} ({ranks[name]:.2f})",
                ha="left" if i >= k / 2 else "right", va="center", fontsize=8)
    for j, (lo, hi) in enumerate(cliques([ranks[m] for m in order], cd)):
        y = -0.25 - 0.12 * j
        ax.hlines(y, ranks[order[lo]] - 0.03, ranks[order[hi]] + 0.03, color="black", linewidth=3)
    fig.savefig(path, dpi=120, bbox_inches="tight")  # the labels reach past the axis
    plt.close(fig)
    return path


def cliques(sorted_ranks: list[float], cd: float) -> list[tuple[int, int]]:
    """Maximal runs (first, last position) of methods, in rank order, all within `cd` of each other."""
    runs, k = [], len(sorted_ranks)
    for lo in range(k):
        hi = lo
        while hi + 1 < k and sorted_ranks[hi + 1] - sorted_ranks[lo] <= cd:
            hi += 1
        if hi > lo and not any(a <= lo and hi <= b for a, b in runs):
            runs.append((lo, hi))
    return runs
