"""The README's own-method example, run as written from a folder outside the package.

The two files and the command are taken from the README itself, so the example a
researcher copies is the one that is tested.
"""

import csv
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT

import fedagg

README = (ROOT / "docs" / "tutorials" / "own-aggregator.md").read_text()  # the tutorial page the README pointed to


def readme_block(first_line: str) -> str:
    """The fenced block of the README whose first line is `first_line`."""
    match = re.search(r"```\w*\n(" + re.escape(first_line) + r"\n.*?)```", README, re.S)
    assert match, f"README has no block starting with {first_line!r}"
    return match.group(1)


def readme_command() -> list[str]:
    line = next(ln for ln in README.splitlines() if ln.startswith("PYTHONPATH=. python -m fedagg.run aggregator=my_rule"))
    return shlex.split(line.removeprefix("PYTHONPATH=. "))


@pytest.fixture
def own_folder(tmp_path):
    for name in ("my_rules/weighted.py", "my_conf/aggregator/my_rule.yaml"):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(readme_block(f"# {name}"))
    return tmp_path


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def check_weights(run_dir, power=0.5):
    """weights.csv holds classes_k * n_k^power, normalised over each round's clients (from partition.json)."""
    clients = {c["id"]: c for c in json.loads((run_dir / "partition.json").read_text())["clients"]}
    rows = _rows(run_dir / "weights.csv")
    for r in {row["round"] for row in rows}:
        mine = [row for row in rows if row["round"] == r]
        score = {int(x["client"]): sum(1 for n in clients[int(x["client"])]["class_counts"] if n > 0)
                 * clients[int(x["client"])]["size"] ** power for x in mine}
        total = sum(score.values())
        for x in mine:
            assert float(x["weight"]) == pytest.approx(score[int(x["client"])] / total, rel=1e-5)
    classes = [sum(1 for n in c["class_counts"] if n > 0) for c in clients.values()]
    assert len(set(classes)) > 1  # the label skew makes the rule differ from size weighting
    metrics = _rows(run_dir / "metrics.csv")
    assert float(metrics[-1]["agg_mean_classes"]) == pytest.approx(sum(classes) / len(classes))


def test_the_readme_example_runs_from_its_own_folder(own_folder):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([".", str(ROOT)]))  # this checkout's fedagg, as installed
    cmd = [sys.executable, *readme_command()[1:], "rounds=2", "hydra.run.dir=run"]
    proc = subprocess.run(cmd, cwd=own_folder, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((own_folder / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["choices"]["aggregator"] == "my_rule"
    assert (summary["method"], summary["method_name"]) == ("my_rule", "Diversity")  # the YAML's display_name
    check_weights(own_folder / "run")


def test_run_experiment_runs_the_same_job_from_python(own_folder, monkeypatch):
    monkeypatch.chdir(own_folder)
    monkeypatch.syspath_prepend(str(own_folder))
    summary = fedagg.run_experiment(["aggregator=my_rule", "hydra.searchpath=[file://my_conf]", "rounds=2",
                                     "aggregator.power=1.0"], own_folder / "py")
    assert summary["status"] == "completed" and summary["config"]["aggregator"]["power"] == 1.0
    assert json.loads((own_folder / "py" / "summary.json").read_text())["rounds_completed"] == 2
    check_weights(own_folder / "py", power=1.0)


def test_the_range_in_the_readme_signature_is_refused_before_anything_is_built(own_folder, monkeypatch):
    """`power: Annotated[float, Range(ge=0)]` is the whole declaration: the config check refuses -1 in its words
    (nothing trained, no metrics written), and the class built from Python refuses it in the same line."""
    from fedagg.run import SetupError

    monkeypatch.chdir(own_folder)
    monkeypatch.syspath_prepend(str(own_folder))
    line = "aggregator.power=-1 is not allowed; it must be a number >= 0"
    with pytest.raises(SetupError) as err:
        fedagg.run_experiment(["aggregator=my_rule", "hydra.searchpath=[file://my_conf]", "aggregator.power=-1"],
                              own_folder / "bad")
    assert str(err.value) == line
    assert not (own_folder / "bad" / "metrics.csv").exists() and not (own_folder / "bad" / "partition.json").exists()
    from my_rules.weighted import Diversity

    with pytest.raises(ValueError) as err:
        Diversity(power=-1)
    assert str(err.value) == line
    assert Diversity(power=0).power == 0
