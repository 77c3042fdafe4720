"""The time runs took on the clock, counting once what ran at once.

A run's interval is [finished_at − wall_time_s, finished_at] (summary.json; a run from before
`finished_at` was recorded ends when its summary.json was last written). The time a set of
runs took is the length of the union of their intervals: jobs a launcher ran side by side
count once, and the sum of the runs' wall times, which counts them once each, is not shown as
time spent. The jobs of a stacked group (summary.json's `group_started_at`) trained at once,
each reporting its share of the group's time as `wall_time_s`: those of a group among `runs`
take one interval from the group's start, as long as the sum of their shares (the whole
group: its time; one method of it: that method's part).
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


def intervals(runs: list[dict]) -> list[tuple[float, float]]:
    """Each run's interval, but one a stacked group's (the runs of `runs` in it: their shares, end to end)."""
    spans, groups = [], {}
    for run in runs:
        start, wall = number(run.get("group_started_at")), number(run.get("wall_time_s"))
        if start is not None and wall is not None:
            groups[start] = groups.get(start, 0.0) + wall
        elif (i := interval(run)) is not None:
            spans.append(i)
    return spans + [(start, start + total) for start, total in groups.items()]


def spent(runs: list[dict]) -> float:
    """Seconds covered by at least one run's interval (a stacked group's runs: one interval)."""
    spans = sorted(intervals(runs))
    total, start, end = 0.0, None, None
    for a, b in spans:
        if end is None or a > end:
            total += 0.0 if end is None else end - start
            start, end = a, b
        else:
            end = max(end, b)
    return total + (end - start if end is not None else 0.0)
