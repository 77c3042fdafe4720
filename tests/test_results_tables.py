"""fedagg.results tables: grouping by any group's choice, renderings, and the honest refusals."""

from __future__ import annotations

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
