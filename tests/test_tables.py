"""fedagg.results tables and plots on hand-made run folders."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from conftest import ROOT


from fedagg.results import plots as plot, table as make_table
from fedagg.results.derived import LAST_K


def write_paper(path: Path, header: list[str], rows: list[list]) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_run(folder: Path, name: str, *, spec: dict, method: str, dataset: str, seed: int, status="completed",
              acc=None, best=None, rounds_to_target=None, target=None, scale=1.0, extra=False, logger=None,
              metrics=None, weights=None) -> Path:
    run = folder / name
    run.mkdir(parents=True)
    summary = {"status": status, "final_test_acc": acc, "best_test_acc": best if best is not None else acc,
               "rounds_completed": 3, "rounds_to_target": rounds_to_target, "target_acc": target, "seed": seed,
               "experiment_scale": scale, "uses_extra_data": extra, "server_samples": 200 if extra else 0,
               "choices": {"dataset": dataset, "aggregator": None},
               "config": {"method": method, "seed": seed, "table": spec,
                          "logger": logger or {"_target_": "fedagg.tracking.base.Tracker"}}}
    (run / "summary.json").write_text(json.dumps(summary))
    for fname, rows in (("metrics.csv", metrics), ("weights.csv", weights)):
        if rows:
            with open(run / fname, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
    return run


def toy_spec(paper: Path, **extra) -> dict:
    return {"name": "toy", "source": "toy.txt, Table 9", "caption": "Accuracy (%)", "metric": "final_test_acc",
            "percent": True, "decimals": 2, "paper": str(paper), "rows": ["method"], "columns": ["dataset"],
            "row_header": "Method", "keys": {"method": "config.method", "dataset": "choices.dataset"},
            "labels": {"method": {"fedavg": "FedAvg", "fedlaw": "FedLAW", "fedprox": "FedProx"},
                       "dataset": {"mnist": "MNIST", "cifar10": "C-10"}}, **extra}


def test_make_table_prints_the_papers_layout_with_mean_std_paper_and_difference(tmp_path, capsys):
    paper = write_paper(tmp_path / "toy.csv", ["method", "dataset", "paper"], [
        ["fedavg", "mnist", "91.50"], ["fedavg", "cifar10", "×"], ["fedlaw", "mnist", "81"],
        ["fedlaw", "cifar10", "70"], ["fedprox", "mnist", "88"], ["fedprox", "cifar10", ""]])
    spec = toy_spec(paper)
    runs = tmp_path / "sweep"
    for seed, acc in enumerate([0.90, 0.92, 0.94]):
        write_run(runs, f"{seed}_fedavg_mnist", spec=spec, method="fedavg", dataset="mnist", seed=seed, acc=acc, scale=0.5)
    write_run(runs, "3_fedavg_mnist", spec=spec, method="fedavg", dataset="mnist", seed=3, status="diverged", scale=0.5)
    for seed in (0, 1):
        write_run(runs, f"{seed}_fedavg_cifar10", spec=spec, method="fedavg", dataset="cifar10", seed=seed,
                  status="diverged", scale=0.5)
    write_run(runs, "0_fedlaw_mnist", spec=spec, method="fedlaw", dataset="mnist", seed=0, acc=0.80, extra=True, scale=0.5)
    write_run(runs, "0_fedlaw_cifar10", spec=spec, method="fedlaw", dataset="cifar10", seed=0, status="failed",
              extra=True, scale=0.5)

    assert make_table.main([str(runs)]) == 0
    printed = capsys.readouterr().out
    assert printed == (runs / "table.md").read_text()
    lines = printed.splitlines()
    table = lines[lines.index("| Method | MNIST | C-10 |"):][:5]
    assert table == [
        "| Method | MNIST | C-10 |",
        "|---|---|---|",
        "| FedAvg | 92.00 ± 2.00 (1/4 ×) (91.50, +0.50) | × (×) |",
        "| FedLAW † | 80.00 (81.00, -1.00) | — (70.00) |",
        "| FedProx | — (88.00) | — (—) |",
    ]
    assert lines[0] == "### toy: Accuracy (%)"
    assert "Paper: toy.txt, Table 9" in lines
    assert any(line.startswith("**Scaled runs (experiment_scale = 0.5)**") for line in lines)
    assert any(line.startswith("† uses extra data on the server") for line in lines)
    assert any(line.startswith("1 run(s) left out (not completed): 0_fedlaw_cifar10 (failed)") for line in lines)

    with open(runs / "table.csv", newline="") as f:
        cells = {(r["method"], r["dataset"]): r for r in csv.DictReader(f)}
    assert len(cells) == 6
    avg = cells[("fedavg", "mnist")]
    assert (avg["n_runs"], avg["n_completed"], avg["n_diverged"], avg["seeds"]) == ("4", "3", "1", "0 1 2")
    assert float(avg["mean"]) == pytest.approx(92.0) and float(avg["std"]) == pytest.approx(2.0)
    assert float(avg["paper"]) == 91.5 and float(avg["diff"]) == pytest.approx(0.5)
    assert cells[("fedavg", "cifar10")]["measured_text"] == "×" and cells[("fedavg", "cifar10")]["paper_text"] == "×"


def test_make_table_unscaled_runs_carry_no_scaled_note_and_average_the_rows(tmp_path, capsys):
    paper = write_paper(tmp_path / "toy.csv", ["method", "dataset", "paper"],
                        [["fedavg", "mnist", "90"], ["fedavg", "cifar10", "70"]])
    spec = toy_spec(paper, average_column=True)
    runs = tmp_path / "sweep"
    write_run(runs, "a", spec=spec, method="fedavg", dataset="mnist", seed=0, acc=0.91)
    write_run(runs, "b", spec=spec, method="fedavg", dataset="cifar10", seed=0, acc=0.73)
    make_table.main([str(runs)])
    out = capsys.readouterr().out
    assert "| FedAvg | 91.00 (90.00, +1.00) | 73.00 (70.00, +3.00) | 82.00 (80.00, +2.00) |" in out
    assert "Scaled" not in out


def test_the_papers_metric_is_named_and_final_or_best_picks_the_column(tmp_path, capsys):
    paper = tmp_path / "toy.csv"
    paper.write_text("# metric: best_test_acc  (the authors' code keeps the best round)\nmethod,dataset,paper\nfedavg,mnist,95\n")
    spec = toy_spec(paper)
    runs = tmp_path / "sweep"
    for seed, (acc, best) in enumerate([(0.90, 0.94), (0.92, 0.96)]):
        write_run(runs, f"{seed}", spec=spec, method="fedavg", dataset="mnist", seed=seed, acc=acc, best=best)
    make_table.main([str(runs)])  # the table's own metric, final
    out = capsys.readouterr().out
    assert "| FedAvg | 91.00 ± 1.41 (95.00, -4.00) |" in out
    assert ("The paper's numbers are best_test_acc  (the authors' code keeps the best round). **This table shows "
            "final_test_acc instead**: `--metric best_test_acc` compares like with like.") in out
    make_table.main([str(runs), "--metric", "best"])
    out = capsys.readouterr().out
    assert "| FedAvg | 95.00 ± 1.41 (95.00, +0.00) |" in out and "instead" not in out
    assert "Each cell: measured best_test_acc (%)" in out


def test_the_settings_profile_is_named_and_a_mix_is_flagged(tmp_path, capsys):
    paper = write_paper(tmp_path / "toy.csv", ["method", "dataset", "paper"], [["fedavg", "mnist", "90"]])
    runs = tmp_path / "sweep"
    write_run(runs, "a", spec=toy_spec(paper, profile="code"), method="fedavg", dataset="mnist", seed=0, acc=0.9)
    make_table.main([str(runs)])
    assert "Settings profile: code (`table.profile`" in capsys.readouterr().out
    write_run(runs, "b", spec=toy_spec(paper, profile="paper"), method="fedavg", dataset="mnist", seed=1, acc=0.8)
    make_table.main([str(runs)])
    assert "**Runs of several settings profiles are pooled here**: code (1 runs), paper (1 runs)" in capsys.readouterr().out


def test_every_paper_csv_names_a_metric_its_table_can_show():
    for path in sorted((ROOT / "paper_results").glob("*.csv")):
        first = path.read_text().splitlines()[0]
        assert first.startswith("# metric: "), path.name
        assert first.split()[2] in ("final_test_acc", "best_test_acc", "rounds_to_target", LAST_K), path.name


def test_make_table_shows_rounds_to_target_and_never_reached_as_na_with_best_accuracy(tmp_path, capsys):
    paper = write_paper(tmp_path / "adp.csv", ["method", "dataset", "paper", "paper_best"],
                        [["fedavg", "mnist", "N/A", "94.48"], ["fedadp", "mnist", "61", ""]])
    spec = toy_spec(paper, metric="rounds_to_target", percent=False, decimals=0,
                    labels={"method": {"fedavg": "FedAvg", "fedadp": "FedAdp"}, "dataset": {"mnist": "MNIST 95%"}})
    runs = tmp_path / "sweep"
    for seed, best in enumerate([0.9448, 0.9450]):
        write_run(runs, f"avg{seed}", spec=spec, method="fedavg", dataset="mnist", seed=seed, acc=best - 0.01,
                  best=best, target=0.95)
    for seed, rounds in enumerate([60, 62]):
        write_run(runs, f"adp{seed}", spec=spec, method="fedadp", dataset="mnist", seed=seed, acc=0.96,
                  rounds_to_target=rounds, target=0.95)
    make_table.main([str(runs)])
    out = capsys.readouterr().out
    assert "| FedAvg | N/A (94.49%) (N/A (94.48%)) |" in out
    assert "| FedAdp | 61 ± 1 (61, +0) |" in out
    assert "Rounds to reach the target accuracy (0.95)" in out


def test_make_table_works_on_plain_sweeps_with_keys_given_on_the_command_line(tmp_path, capsys):
    runs = tmp_path / "sweep"
    for seed, (agg, acc) in enumerate([("fedavg", 0.5), ("fedadp", 0.6)]):
        run = write_run(runs, f"{seed}", spec=None, method=agg, dataset="digits", seed=0, acc=acc)
        summary = json.loads((run / "summary.json").read_text())
        summary["choices"]["aggregator"] = agg
        del summary["config"]["table"]
        (run / "summary.json").write_text(json.dumps(summary))
    make_table.main([str(runs), "--metric", "best_test_acc"])
    out = capsys.readouterr().out
    assert "| Method | digits |" in out and "| fedadp | 60.00 |" in out  # no published numbers: no (—)


def curve_rows(acc0: float) -> list[dict]:
    return [{"round": r, "test_acc": acc0 + 0.1 * r, "test_loss": 1.0 / r, "train_loss": 1.0 / r,
             "update_norm": 0.5 / r, "client_update_norm": 1.0 / r} for r in (1, 2, 3)]


def weight_rows() -> list[dict]:
    return [{"round": r, "client": c, "weight": w, "num_samples": 10} for r in (1, 2, 3)
            for c, w in ((0, 0.3 + 0.05 * r), (1, 0.7 - 0.05 * r))]


def make_plot_runs(folder: Path, logger: dict | None = None) -> None:
    spec = toy_spec(folder / "none.csv")
    for seed in (0, 1):
        for method in ("fedavg", "fedawa"):
            write_run(folder, f"{method}{seed}", spec=spec, method=method, dataset="mnist", seed=seed, acc=0.5,
                      metrics=curve_rows(0.1 * seed), weights=weight_rows(), logger=logger)


def test_plot_writes_accuracy_norm_and_weight_pngs_beside_the_runs(tmp_path):
    make_plot_runs(tmp_path / "sweep")
    assert plot.main([str(tmp_path / "sweep")]) == 0
    for name in ("accuracy.png", "update_norms.png", "weights.png"):
        path = tmp_path / "sweep" / name
        assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert not (tmp_path / "sweep" / "wandb").exists()  # the runs did not use W&B
    # a single run: the PNGs go into its own folder
    assert plot.main([str(tmp_path / "sweep" / "fedavg0")]) == 0
    assert (tmp_path / "sweep" / "fedavg0" / "weights.png").exists()


@pytest.mark.slow  # W&B's offline service takes a few seconds to start
def test_plot_logs_to_an_offline_wandb_run_when_the_runs_used_wandb(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = {"_target_": "fedagg.tracking.wandb_tracker.WandbTracker", "project": "fedagg-test", "entity": None,
              "mode": "offline", "group": None, "tags": [], "name": None}
    make_plot_runs(tmp_path / "sweep", logger=logger)
    assert plot.main([str(tmp_path / "sweep")]) == 0
    offline = list((tmp_path / "sweep" / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].rglob("*.wandb"))


def test_measured_only_keeps_just_the_rows_and_columns_that_have_runs(tmp_path):
    paper = write_paper(tmp_path / "toy.csv", ["method", "dataset", "paper"], [
        ["fedavg", "mnist", "91"], ["fedavg", "cifar10", "70"], ["fedprox", "mnist", "88"], ["fedprox", "cifar10", "71"]])
    spec = toy_spec(paper, average_column=True)
    runs = tmp_path / "sweep"
    write_run(runs, "0_fedavg_mnist", spec=spec, method="fedavg", dataset="mnist", seed=0, acc=0.90)
    assert make_table.main([str(runs)]) == 0
    full = (runs / "table.md").read_text().splitlines()
    assert "| Method | MNIST | C-10 | Average |" in full and any(line.startswith("| FedProx |") for line in full)
    assert make_table.main([str(runs), "--measured-only"]) == 0
    text = (runs / "table.md").read_text()
    lines = text.splitlines()
    assert "| Method | MNIST | Average |" in lines
    assert "| FedAvg | 90.00 (91.00, -1.00) | 90.00 (91.00, -1.00) |" in lines  # the average over shown cells only
    assert not any(line.startswith("| FedProx |") for line in lines)
    assert "Only the rows and columns with runs are shown" in text
    with open(runs / "table.csv", newline="") as f:
        assert [(r["method"], r["dataset"]) for r in csv.DictReader(f)] == [("fedavg", "mnist")]
