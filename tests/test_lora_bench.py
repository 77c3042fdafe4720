"""The adapter benchmark's pieces: `fedagg.results plot --curve COLUMN` on hand-made runs, and
scripts/lora_bench.sh end to end at a tiny scale (slow)."""

from __future__ import annotations

from pathlib import Path

from results_runs import fake_run

from fedagg.results import plots


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


def test_curve_of_a_column_no_run_has_is_one_line_before_any_figure(tmp_path, monkeypatch, capsys):
    adapter_runs(tmp_path / "sweep")
    assert plots.main([str(tmp_path / "sweep"), "--curve", "agg_eror", "--wandb-mode", "disabled"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["--curve agg_eror: no run's metrics.csv has that column"]
    assert not list((tmp_path / "sweep").glob("*.png"))

