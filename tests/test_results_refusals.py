"""Honest tables: each input that would show a misleading number gets its one line and exit 2, no traceback."""

from __future__ import annotations

import json
import os

from fedagg.results import plots, report
from fedagg.results.groups import GROUPS
from fedagg.results.table import main as table_main
from results_runs import dead_pid, fake_run, unfinished_run


def refusal(capsys, main, argv) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    return captured.err.rstrip("\n")


def test_runs_of_other_settings_pooled_as_seeds_are_refused_naming_the_setting(tmp_path, capsys, monkeypatch):
    sweep = tmp_path / "sweep"  # aggregator=fedavg,median system=none,dropout seed=0,1
    i = 0
    for agg in ("fedavg", "median"):
        for system in ("none", "dropout"):
            for seed in (0, 1):
                noise = 0.003 if (agg, seed) == ("median", 1) else 0.0  # paired differences that are not constant
                where = f"data.root=/data{seed}"  # where the files were is no setting of the result
                fake_run(sweep / str(i), seed=seed, acc=0.5 + 0.01 * i + noise, choices={"aggregator": agg, "system": system},
                         overrides=[f"aggregator={agg}", f"system={system}", f"seed={seed}", where])
                i += 1
    expected = ("the cell fedavg digits pools runs that differ in system (dropout, none), which is neither a row, a "
                "column nor the seed: add it (--columns dataset system) or table each value apart")
    assert refusal(capsys, table_main, [str(sweep)]) == expected
    assert refusal(capsys, table_main, [str(sweep), "--baseline", "fedavg"]) == expected
    assert table_main([str(sweep), "--columns", "dataset", "system"]) == 0
    assert "| median | 56.65 ± 0.92 | 54.65 ± 0.92 |" in capsys.readouterr().out  # columns: dropout, none
    # the report and the plots split what the table would pool: a column and a panel per system
    runs, _ = plots.finished_runs([sweep])
    assert plots.sweep_axes(runs) == ["system"]
    assert plots.describe(runs[2], ["system"]) == ("system=dropout", "fedavg")
    figures = []
    monkeypatch.setattr(plots.plt, "close", figures.append)  # keep the figure to read its panel titles
    for run in runs:
        run["weights"] = [{"round": 1, "client": 0, "weight": 1.0}]
    plots.plot_weights(runs, tmp_path, 12, ["system"])  # a panel per run: every seed
    titles = sorted(ax.get_title() for ax in figures[0].axes if ax.get_visible())
    assert titles == [f"{m} · system={s} · seed {seed}" for m in ("fedavg", "median") for s in ("dropout", "none")
                      for seed in (0, 1)]
    plots.plot_weights(runs, tmp_path, 4, ["system"])  # four panels: every cell's first seed
    titles = sorted(ax.get_title() for ax in figures[1].axes if ax.get_visible())
    assert titles == ["fedavg · system=dropout · seed 0", "fedavg · system=none · seed 0",
                      "median · system=dropout · seed 0", "median · system=none · seed 0"]
    monkeypatch.undo()
    assert report.main([str(sweep), "--wandb-mode", "disabled"]) == 0
    page = (sweep / "report.html").read_text()
    assert "<tr><th>Method</th><th>digits dropout</th><th>digits none</th></tr>" in page
    assert "<tr><td>median</td><td>56.65 ± 0.92</td><td>54.65 ± 0.92</td></tr>" in page
    capsys.readouterr()
    # a copy of a run: two completed runs of one seed in a cell
    os.rename(sweep / "7", tmp_path / "kept")
    (sweep / "7").mkdir()
    summary = json.loads((sweep / "6" / "summary.json").read_text())
    (sweep / "7" / "summary.json").write_text(json.dumps(summary))
    assert refusal(capsys, table_main, [str(sweep), "--columns", "dataset", "system"]) == (
        "the cell median digits dropout has 2 completed runs of seed 0 (6, 7): remove the copies or table them apart")


def test_every_metric_gets_a_fitting_format_and_a_metric_no_run_has_is_refused(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for seed, p10 in enumerate([0.37, 0.50]):
        fake_run(sweep / str(seed), seed=seed, acc=0.8, final_client_acc_p10=p10, wall_time_s=12.25 + seed)
    assert table_main([str(sweep), "--metric", "final_client_acc_p10"]) == 0
    out = capsys.readouterr().out
    assert "| fedavg | 43.50 ± 9.19 |" in out and "measured final_client_acc_p10 (%)" in out
    assert table_main([str(sweep), "--metric", "wall_time_s"]) == 0
    assert "| fedavg | 12.8 ± 0.7 |" in capsys.readouterr().out  # three significant digits, not 13 ± 1
    have = "best_test_acc, final_client_acc_p10, final_test_acc, rounds_completed, seed, wall_time_s"
    assert refusal(capsys, table_main, [str(sweep), "--metric", "final_acc"]) == (
        f"--metric final_acc: no completed run has final_acc in its summary.json; they have {have}")
    assert refusal(capsys, table_main, [str(sweep), "--metric", "final_client_acc_mean"]) == (
        "--metric final_client_acc_mean: no completed run has final_client_acc_mean in its summary.json (per-client "
        f"metrics need runs with eval.per_client=true); they have {have}")


def test_an_unknown_row_key_is_refused(tmp_path, capsys):
    fake_run(tmp_path / "sweep" / "0")
    assert refusal(capsys, table_main, [str(tmp_path / "sweep"), "--rows", "algo"]) == (
        f"--rows algo: no run has config.algo; use a group ({', '.join(GROUPS)}), a config key such as "
        "partition.alpha, or --key algo=PATH to say where it is in summary.json")
    assert refusal(capsys, table_main, [str(tmp_path / "sweep"), "--columns", "alpha"]).startswith(
        "--columns alpha: no run has config.alpha;")


def test_a_damaged_summary_is_named_by_the_plot_and_the_report(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    fake_run(sweep / "0", metrics=[{"round": 1, "test_acc": 0.5}])
    (sweep / "1").mkdir()
    (sweep / "1" / "summary.json").write_text("")
    expected = (f"{sweep / '1' / 'summary.json'} is damaged (JSONDecodeError: Expecting value: line 1 column 1 "
                "(char 0)); repair or remove that run folder")
    assert refusal(capsys, plots.main, [str(sweep)]) == expected
    assert refusal(capsys, report.main, [str(sweep), "--wandb-mode", "disabled"]) == expected


def test_running_and_killed_jobs_are_named_never_drawn_or_pooled(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for seed in (0, 1):
        fake_run(sweep / str(seed), seed=seed, acc=0.5 + 0.1 * seed,
                 metrics=[{"round": r, "test_acc": 0.5 + 0.1 * seed * (r == 3)} for r in (1, 2, 3)])
    unfinished_run(sweep / "2", pid=dead_pid(), checkpoint=True)
    unfinished_run(sweep / "3", pid=os.getpid(), checkpoint=False)
    (sweep / "3" / "metrics.csv").write_text("round,test_acc\n1,0.4\n")
    assert table_main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "| fedavg | 55.00 ± 7.07 |" in out and "| digits |" in out and "|  |" not in out
    assert "2 run(s) left out (not completed): 2 (interrupted), 3 (running)" in out
    assert plots.main([str(sweep)]) == 0
    err = capsys.readouterr().err
    assert err == f"2 run(s) without a summary.json left out: {sweep / '2'} (interrupted), {sweep / '3'} (running)\n"

