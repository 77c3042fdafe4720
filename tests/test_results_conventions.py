"""Which value a table shows, stated in its header: final, best (test-set selection), last_k; fairness over clients."""

from __future__ import annotations

import pytest

from fedagg.results import load_sweep
from fedagg.results.derived import gap10, jain
from fedagg.results.table import main as table_main
from results_runs import fake_run


def every_fifth_round(accs: list[float]) -> list[dict]:
    """metrics.csv of 25 rounds evaluated every 5th: the other rows have no test accuracy."""
    return [{"round": r, "test_acc": accs[r // 5 - 1] if r % 5 == 0 else "", "train_loss": 1.0} for r in range(1, 26)]


def test_last_k_is_the_mean_of_the_last_k_evaluated_rounds_and_every_header_states_its_convention(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    fake_run(sweep / "0", seed=0, acc=0.5, best=0.55, rounds_completed=25,
             metrics=every_fifth_round([0.1, 0.2, 0.3, 0.4, 0.5]))
    fake_run(sweep / "1", seed=1, acc=0.7, best=0.7, rounds_completed=25,
             metrics=every_fifth_round([0.3, 0.4, 0.5, 0.6, 0.7]))
    # k = ceil(25 / 10) = 3 evaluated rounds: (0.3 + 0.4 + 0.5) / 3 = 0.4 and (0.5 + 0.6 + 0.7) / 3 = 0.6
    assert table_main([str(sweep), "--metric", "last_k"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == ("Metric: last_k_test_acc (last_k: the mean test accuracy over the last k = 3 evaluated rounds "
                        "of runs of 25 rounds; k = ⌈R/10⌉ unless --last-k is given).")
    assert "| fedavg | 50.00 ± 14.14 |" in lines
    assert table_main([str(sweep), "--metric", "last_k", "--last-k", "2"]) == 0  # (0.4 + 0.5) / 2, (0.6 + 0.7) / 2
    assert "| fedavg | 55.00 ± 14.14 |" in capsys.readouterr().out.splitlines()
    assert table_main([str(sweep), "--metric", "best"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("Metric: best_test_acc (best: the highest test accuracy over the evaluated rounds; the "
                               "round is selected on the test set itself (test-set selection)")
    assert table_main([str(sweep), "--metric", "final"]) == 0
    assert capsys.readouterr().out.splitlines()[2] == (
        "Metric: final_test_acc (final: the test accuracy of the model after the last round).")
    assert table_main([str(sweep)]) == 0  # the default: last_k, the comparison's test metric, said in the header
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("Metric: last_k_test_acc (last_k: the mean test accuracy over the last k = 3 evaluated")
    assert "| FedAvg | 50.00 ± 14.14 |" in lines or "| fedavg | 50.00 ± 14.14 |" in lines
    assert load_sweep(sweep)["last_k_test_acc"].tolist() == pytest.approx([0.4, 0.6])


def test_a_table_whose_own_metric_is_last_k_computes_it_without_being_asked(tmp_path, capsys):
    """table.metric: last_k_test_acc (fedopt_table2) is derived from metrics.csv as --metric last_k is: it is in
    no summary.json, and the table once refused such a sweep ("no completed run has last_k_test_acc")."""
    sweep = tmp_path / "sweep"
    table = {"name": "t", "metric": "last_k_test_acc", "rows": ["aggregator"], "columns": ["dataset"]}
    for seed, accs in ((0, [0.1, 0.2, 0.3, 0.4, 0.5]), (1, [0.3, 0.4, 0.5, 0.6, 0.7])):
        fake_run(sweep / str(seed), seed=seed, acc=accs[-1], rounds_completed=25, config={"table": table},
                 metrics=every_fifth_round(accs))
    assert table_main([str(sweep)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("Metric: last_k_test_acc (last_k: the mean test accuracy over the last k = 3") for line in lines)
    assert "| fedavg | 50.00 ± 14.14 |" in lines


def test_a_tables_window_in_rounds_averages_the_evaluations_inside_it_and_header_and_caption_say_so(tmp_path, capsys):
    """table.last_rounds (fedopt_table2: the paper's last 100 rounds) is a window in rounds, not in evaluations:
    40 rounds evaluated every 5th with a 10-round window average rounds 35 and 40 only (⌈40/10⌉ = 4 evaluations
    would take rounds 25..40); --last-k still counts evaluations."""
    sweep = tmp_path / "sweep"
    table = {"name": "t", "metric": "last_k_test_acc", "last_rounds": 10, "rows": ["aggregator"], "columns": ["dataset"],
             "percent": True}
    accs = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.9]  # rounds 5, 10, ..., 40
    rows = [{"round": r, "test_acc": accs[r // 5 - 1] if r % 5 == 0 else "", "train_loss": 1.0} for r in range(1, 41)]
    fake_run(sweep / "0", seed=0, acc=0.9, rounds_completed=40, config={"table": table}, metrics=rows)
    assert table_main([str(sweep)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert ("Metric: last_k_test_acc (the mean test accuracy over the last 10 rounds: k = 2 evaluated rounds of runs "
            "of 40 rounds; the table's window, table.last_rounds; --last-k K averages the last K evaluated rounds "
            "instead).") in lines
    assert "| fedavg | 80.00 |" in lines  # (0.7 + 0.9) / 2
    assert load_sweep(sweep)["last_k_test_acc"].tolist() == pytest.approx([0.8])
    assert table_main([str(sweep), "--last-k", "4"]) == 0  # (0.5 + 0.6 + 0.7 + 0.9) / 4
    assert "| fedavg | 67.50 |" in capsys.readouterr().out.splitlines()
    assert table_main([str(sweep), "--format", "latex"]) == 0
    assert "Test accuracy averaged over the last 10 rounds" in capsys.readouterr().out


def clients(values: list[float]) -> list[dict]:
    """clients.csv with an earlier evaluation (round 1, all 0.9) that the final metrics must ignore."""
    return ([{"round": 1, "client": c, "test_acc": 0.9} for c in range(len(values))]
            + [{"round": 3, "client": c, "test_acc": v} for c, v in enumerate(values)])


def test_jains_index_and_the_best_minus_worst_ten_percent_gap_by_hand(tmp_path, capsys):
    four = [0.2, 0.4, 0.6, 0.8]  # (2.0)^2 / (4 * 1.2) = 5/6; 10% of 4 clients: 1 each, 0.8 - 0.2
    eleven = [i / 10 for i in range(11)]  # 5.5^2 / (11 * 3.85) = 5/7; 2 clients each: 0.95 - 0.05
    assert jain(four) == pytest.approx(5 / 6) and gap10(four) == pytest.approx(0.6)
    assert jain(eleven) == pytest.approx(5 / 7) and gap10(eleven) == pytest.approx(0.9)
    assert jain([0.5] * 3) == pytest.approx(1.0) and jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(1 / 4)
    sweep = tmp_path / "sweep"
    fake_run(sweep / "0", seed=0, clients=clients(four), final_client_acc_mean=0.5)
    fake_run(sweep / "1", seed=1, clients=clients(eleven), final_client_acc_mean=0.5)
    frame = load_sweep(sweep)
    assert frame["final_client_jain"].tolist() == pytest.approx([5 / 6, 5 / 7])
    assert frame["final_client_acc_gap10"].tolist() == pytest.approx([0.6, 0.9])
    assert table_main([str(sweep), "--metric", "jain"]) == 0
    out = capsys.readouterr().out
    # mean (5/6 + 5/7) / 2 = 0.7738, std |5/6 - 5/7| / sqrt(2) = 0.0842: three significant digits
    assert "| fedavg | 0.774 ± 0.084 |" in out and "Jain's index (Σa)² / (n Σa²)" in out
    assert table_main([str(sweep), "--metric", "gap10"]) == 0
    assert "| fedavg | 75.00 ± 21.21 |" in capsys.readouterr().out  # percentage points
    assert table_main([str(sweep), "--metric", "final"]) == 0
    assert "`--metric final_client_acc_mean` shows the mean of the per-client accuracies" in capsys.readouterr().out
