"""fedagg.results tables: grouping by any group's choice, renderings, and the honest refusals."""

from __future__ import annotations

import pytest

from fedagg.results.table import main as table_main
from results_runs import fake_run


def test_rows_attack_and_system_group_by_the_chosen_option(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for i, (attack, system, acc) in enumerate([("none", "none", 0.9), ("sign_flip", "none", 0.6),
                                              ("none", "dropout", 0.8), ("sign_flip", "dropout", 0.5)]):
        fake_run(sweep / str(i), acc=acc, choices={"attack": attack, "system": system},
                 config={"attack": {"_target_": "fedagg.attacks.base.Attack", "fraction": 0.0 if attack == "none" else 0.2}})
    assert table_main([str(sweep), "--rows", "attack", "--columns", "system"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("| attack | dropout | none |")
    assert lines[start:start + 4] == ["| attack | dropout | none |", "|---|---|---|",
                                      "| none | 80.00 | 90.00 |", "| sign_flip | 50.00 | 60.00 |"]


def two_method_sweep(folder, accs=None):
    accs = accs or {"fedavg": [0.90, 0.92], "fedprox": [0.91, 0.95]}
    i = 0
    for method, values in accs.items():
        for seed, acc in enumerate(values):
            fake_run(folder / str(i), acc=acc, seed=seed, choices={"aggregator": method})
            i += 1
    return folder


def test_a_table_is_data_and_every_rendering_shows_the_same_cells(tmp_path):
    from fedagg.results.table import build_table

    table = build_table(two_method_sweep(tmp_path / "sweep"), baseline="fedavg")
    grid = table.grids()[0]
    assert list(grid.columns) == ["Method", "digits"]
    assert grid.values.tolist() == [["fedavg", "91.00 ± 1.41"], ["fedprox", "93.00 ± 2.83"]]
    cells = table.cells.set_index("method")
    assert cells.loc["fedprox", "mean"] == pytest.approx(93.0) and cells.loc["fedprox", "n_pairs"] == 2
    assert cells.loc["fedprox", "diff_to_baseline"] == pytest.approx(2.0)  # (1 + 3) / 2
    latex = table.to_latex()  # one table a paper includes: mean ± sd, Δ to the baseline with its interval, best bold
    assert latex.count(r"\begin{table}") == latex.count("\n\\toprule") == latex.count("\n\\bottomrule") == 1
    assert latex.startswith(r"% Needs \usepackage{booktabs}") and r"\label{tab:sweep}" in latex
    ci = table.cells.set_index("method").loc["fedprox"]
    assert (rf"fedprox & \textbf{{93.00 $\pm$ 2.83}} & +2.00 [{ci['ci_low']:+.2f}, {ci['ci_high']:+.2f}] \\"
            .replace("-", "$-$") in latex)
    assert r"fedavg & 91.00 $\pm$ 1.41 & --- \\" in latex
    assert r"Method & Acc. (\%) & $\Delta$ [95\% CI] \\" in latex
    assert "over 2 seeds" in latex and "paired difference to fedavg" in latex and "**" not in latex
    html = table.to_html()
    assert "<tr><td>fedprox</td><td>93.00 ± 2.83</td></tr>" in html and "<h5>Paired difference to fedavg</h5>" in html
    markdown = table.to_markdown()
    assert "| fedprox | 93.00 ± 2.83 |" in markdown and "| fedprox | +2.00 (1 pair)" not in markdown
    assert "| fedprox | +2.00 [" in markdown
    csv_lines = table.to_csv().splitlines()
    assert csv_lines[0].startswith("method,dataset,n_runs,n_completed,n_diverged,n_other,mean,std,seeds,")
    assert csv_lines[2].startswith("fedprox,digits,2,2,0,0,93.0,2.828427,0 1,")


@pytest.mark.slow  # a CLI subprocess of 10-30 s; the default suite must stay under 10 minutes
def test_one_command_line_prints_the_table_the_library_builds(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT
    from fedagg.results import build_table

    sweep = two_method_sweep(tmp_path / "sweep")
    cli = [sys.executable, "-m", "fedagg.results"]
    done = subprocess.run([*cli, "table", str(sweep), "--baseline", "fedavg"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == build_table(sweep, baseline="fedavg").to_markdown()
    assert (sweep / "table.md").read_text() == done.stdout
    stats = subprocess.run([*cli, "stats", str(tmp_path / "nowhere"), "--baseline", "fedavg"], cwd=ROOT,
                           capture_output=True, text=True)
    assert (stats.returncode, stats.stdout) == (2, "")
    assert stats.stderr == f"{tmp_path / 'nowhere'} does not exist; give a run folder or a sweep folder\n"
