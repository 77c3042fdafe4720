"""The time runs took on the clock, counting once what ran at once.

A run's interval is [finished_at − wall_time_s, finished_at] (summary.json; a run from before
`finished_at` was recorded ends when its summary.json was last written). The time a set of
runs took is the length of the union of their intervals: jobs a launcher ran side by side,
and the jobs of a stacked group (each reports its group's time), count once, and the sum of
the runs' wall times, which counts them once each, is not shown as time spent.
"""

from __future__ import annotations

from pathlib import Path

from fedagg.results.values import number


def interval(run: dict) -> tuple[float, float] | None:
    wall = number(run.get("wall_time_s"))
    end = number(run.get("finished_at"))
    if end is None and run.get("_path") is not None and (Path(run["_path"]) / "summary.json").exists():
        end = (Path(run["_path"]) / "summary.json").stat().st_mtime
    return None if wall is None or end is None else (end - wall, end)


def spent(runs: list[dict]) -> float:
    """Seconds covered by at least one run's interval."""
    spans = sorted(i for run in runs if (i := interval(run)) is not None)
    total, start, end = 0.0, None, None
    for a, b in spans:
        if end is None or a > end:
            total += 0.0 if end is None else end - start
            start, end = a, b
        else:
            end = max(end, b)
    return total + (end - start if end is not None else 0.0)
