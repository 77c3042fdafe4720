"""The adapter benchmark's pieces: `fedagg.results plot --curve COLUMN` on hand-made runs, and
scripts/lora_bench.sh end to end at a tiny scale (slow)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, SHARED_DATA, needs_mnist
from docs_examples import environment
from results_runs import fake_run

from fedagg.results import plots, table
from fedagg.results.runs import ResultsError

RULES = ["FedIT", "FFA-LoRA", "FedSA-LoRA", "FLoRA", "FedEx-LoRA", "FlexLoRA", "HetLoRA"]


def lines_drawn(monkeypatch) -> dict[str, dict[str, list]]:
    """Per figure file name, each line's label and its (x, y) points: plots' figures, read as they are saved."""
    seen: dict[str, dict[str, list]] = {}
    save = plots.plt.Figure.savefig

    def recording(fig, path, *args, **kwargs):
        seen[Path(path).name] = {line.get_label(): list(zip(line.get_xdata(), line.get_ydata()))
                                 for ax in fig.axes for line in ax.get_lines()}
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(plots.plt.Figure, "savefig", recording)
    return seen


def adapter_runs(folder: Path) -> None:
    """FedIT on two seeds and FLoRA on one record agg_error; FedAvg (full fine-tuning) does not."""
    errors = {("fedit", 0): [0.4, 0.2], ("fedit", 1): [0.2, 0.1], ("flora", 0): [0.3, 0.5]}
    for (rule, seed), values in errors.items():
        fake_run(folder / f"{rule}{seed}", seed=seed, method=rule, method_name=rule.capitalize(),
                 choices={"aggregator": rule},
                 metrics=[{"round": r, "test_acc": 0.5, "agg_error": e} for r, e in enumerate(values, 1)])
    fake_run(folder / "fedavg0", method="fedavg", method_name="Fedavg",
             metrics=[{"round": r, "test_acc": 0.6} for r in (1, 2)])


def test_curve_draws_a_metrics_column_per_round_mean_over_seeds_without_the_runs_that_lack_it(tmp_path, monkeypatch):
    adapter_runs(tmp_path / "sweep")
    seen = lines_drawn(monkeypatch)
    assert plots.main([str(tmp_path / "sweep"), "--curve", "agg_error", "--wandb-mode", "disabled"]) == 0
    assert (tmp_path / "sweep" / "agg_error.png").read_bytes()[:4] == b"\x89PNG"
    curves = {label: [(int(x), round(float(y), 6)) for x, y in points] for label, points in seen["agg_error.png"].items()}
    # FedIT: the mean of its two seeds each round; FLoRA: its one seed; FedAvg has no such column: no line
    assert curves == {"Fedit": [(1, 0.3), (2, 0.15)], "Flora": [(1, 0.3), (2, 0.5)]}
    assert set(seen["accuracy.png"]) == {"Fedit", "Flora", "Fedavg"}  # the other figures keep every run


def test_a_table_experiments_runs_get_a_line_per_method_when_its_rows_are_the_methods(tmp_path, monkeypatch):
    """Rows `[method]` (the run's own id, not a group choice): one line per method in each column's panel, named by
    the table's labels, not every method pooled into one nameless line."""
    spec = {"rows": ["method"], "columns": ["ranks"], "keys": {"ranks": "config.table.ranks"},
            "labels": {"method": {"fedit": "FedIT"}}}
    for rule, values in (("fedit", [0.4, 0.2]), ("flora", [0.3, 0.5])):
        fake_run(tmp_path / "sweep" / rule, method=rule, choices={"aggregator": rule},
                 config={"table": {**spec, "ranks": "homo"}},
                 metrics=[{"round": r, "test_acc": 0.5, "agg_error": e} for r, e in enumerate(values, 1)])
    seen = lines_drawn(monkeypatch)
    assert plots.main([str(tmp_path / "sweep"), "--curve", "agg_error", "--wandb-mode", "disabled"]) == 0
    curves = {label: [round(float(y), 6) for _, y in points] for label, points in seen["agg_error.png"].items()}
    assert curves == {"FedIT": [0.4, 0.2], "flora": [0.3, 0.5]}


def test_curve_of_a_column_no_run_has_is_one_line_before_any_figure(tmp_path, monkeypatch, capsys):
    adapter_runs(tmp_path / "sweep")
    assert plots.main([str(tmp_path / "sweep"), "--curve", "agg_eror", "--wandb-mode", "disabled"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["--curve agg_eror: no run's metrics.csv has that column"]
    assert not list((tmp_path / "sweep").glob("*.png"))


def three_seeds(folder: Path, spec: dict | None = None) -> None:
    """One method on seeds 0-2 with final accuracies 90, 92 and 97%: mean 93, sd √13 = 3.6056."""
    for seed, acc in enumerate((0.90, 0.92, 0.97)):
        fake_run(folder / f"s{seed}", seed=seed, acc=acc, method="fedit", method_name="FedIT",
                 choices={"aggregator": "fedit"}, config={"table": spec} if spec else None)


def test_a_table_shows_each_mean_with_its_95_percent_t_interval_or_the_seeds_sd(tmp_path):
    three_seeds(tmp_path / "sweep")
    cell = lambda built: built.cells.iloc[0]  # noqa: E731
    sd = table.build_table(tmp_path / "sweep", metric="final_test_acc")
    assert cell(sd)["measured_text"] == "93.00 ± 3.61" and "mean ± std over seeds" in sd.to_markdown()
    # t(0.975, 2 degrees of freedom) = 4.3027; 4.3027 x 3.6056 / √3 = 8.9567
    ci = table.build_table(tmp_path / "sweep", metric="final_test_acc", spread="ci95")
    assert cell(ci)["measured_text"] == "93.00 ± 8.96" and abs(cell(ci)["ci95"] - 8.9567) < 1e-3
    assert "mean ± the half-width of the mean's 95% t interval over seeds (0, 1, 2)" in ci.to_markdown()


def test_a_tables_own_spread_is_its_default_and_an_unknown_one_is_one_line(tmp_path):
    three_seeds(tmp_path / "ci", {"metric": "final_test_acc", "spread": "ci95"})
    assert table.build_table(tmp_path / "ci").cells.iloc[0]["measured_text"] == "93.00 ± 8.96"
    assert table.build_table(tmp_path / "ci", spread="sd").cells.iloc[0]["measured_text"] == "93.00 ± 3.61"
    three_seeds(tmp_path / "bad", {"metric": "final_test_acc", "spread": "sem"})
    with pytest.raises(ResultsError) as err:
        table.build_table(tmp_path / "bad")
    assert str(err.value) == ("table.spread='sem' is not allowed; it must be one of sd, ci95 (± the standard deviation "
                              "over seeds, or the half-width of the mean's 95% t interval)")


TINY = {"LORA_BENCH_ROUNDS": "1", "LORA_BENCH_SEEDS": "0,1", "LORA_BENCH_SCALE": "0.05",
        "LORA_BENCH_BASE_SAMPLES": "300", "LORA_BENCH_BUDGET": "2", "LORA_BENCH_CONFIRM": "2"}


def grid_rows(text: str, heading: str) -> dict[str, list[str]]:
    """The body of the first markdown grid after the line holding `heading` in table.md: first cell -> the others."""
    lines = text[text.index(heading):].splitlines()[1:]
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[start + 2:end]]  # after header, rule
    return {cells[0]: cells[1:] for cells in rows}


@pytest.mark.slow  # the whole benchmark at one round on 5% of MNIST: about 10 min on a shared 2-core CPU
@needs_mnist
def test_the_benchmark_script_writes_eight_methods_by_two_rank_settings_with_paired_intervals(tmp_path):
    out = tmp_path / "bench"
    env = environment({"FEDAGG_DATA": str(SHARED_DATA.resolve()), **TINY})
    done = subprocess.run(["bash", "scripts/lora_bench.sh", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=3600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    table = (out / "sweeps" / "table.md").read_text()
    means = grid_rows(table, "### lora_mnist")
    assert list(means) == ["FedAvg, full fine-tuning", *RULES], table
    number = r"\d+\.\d\d ± \d+\.\d\d"  # mean ± sd over the two seeds
    assert all(len(cells) == 2 and all(re.fullmatch(number, c) for c in cells) for cells in means.values()), table
    # FedAvg's runs are the same in both columns: its two cells agree
    assert means["FedAvg, full fine-tuning"][0] == means["FedAvg, full fine-tuning"][1]
    paired = grid_rows(table, "Paired difference to FedIT")
    assert list(paired) == list(means) and paired["FedIT"] == ["baseline", "baseline"], table
    interval = r"[+-]\d+\.\d\d \[[+-]\d+\.\d\d, [+-]\d+\.\d\d\]( \*)?"
    assert all(re.fullmatch(interval, c) for r, cells in paired.items() if r != "FedIT" for c in cells), table
    for name in ("agg_error.png", "accuracy.png"):
        assert (out / "sweeps" / name).read_bytes()[:4] == b"\x89PNG"
    assert (out / "compare" / "table.tex").exists() and (out / "compare" / "report.html").exists()
    confirmed = [json.loads(p.read_text())["status"] for p in (out / "compare" / "confirm").rglob("summary.json")]
    assert confirmed == ["completed"] * 28, confirmed  # 7 rules, tuned and defaults, 2 seeds
    times = (out / "times.txt").read_text()
    for step in ("pretrain", "sweep_homo", "sweep_hetero", "sweep_full", "tables", "figures", "compare"):
        assert re.search(rf"^wall time {step}: \d+ s$", times, re.M), times
    # run again: every step is found done (base kept, runs skipped, the comparison read back)
    again = subprocess.run(["bash", "scripts/lora_bench.sh", str(out)], cwd=ROOT, env={**env, "LORA_BENCH_STEPS": "pretrain"},
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and f"base {out}/base.pt kept" in again.stdout, again.stdout + again.stderr
