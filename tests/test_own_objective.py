"""The own-objective tutorial's feature-norm example, run as written from a folder outside the package: the class and
the YAML are taken from the page (docs/tutorials/own-objective.md), so the example a researcher copies is the one that
is tested."""

import json
import os
import shlex
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
import re

README = (ROOT / "docs" / "tutorials" / "own-objective.md").read_text()


def readme_block(first_line: str) -> str:
    """The page's fenced block whose first line is `first_line`."""
    match = re.search(r"```\w*\n(" + re.escape(first_line) + r"\n.*?)```", README, re.S)
    assert match, f"the page has no block starting with {first_line!r}"
    return match.group(1)

import fedagg
from fedagg.models.base import Representation


def readme_command() -> list[str]:
    line = next(ln for ln in README.splitlines()
                if ln.startswith("PYTHONPATH=. python -m fedagg.run client/objective=feature_norm"))
    return shlex.split(line.removeprefix("PYTHONPATH=. "))


@pytest.fixture
def own_folder(tmp_path):
    for name in ("my_objectives/feature_norm.py", "my_conf/client/objective/feature_norm.yaml"):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(readme_block(f"# {name}"))
    return tmp_path


def test_the_readme_objective_runs_from_its_own_folder(own_folder):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([".", str(ROOT)]), OMP_NUM_THREADS="1")
    cmd = [sys.executable, *readme_command()[1:], "rounds=2", "device=cpu", "hydra.run.dir=run"]
    proc = subprocess.run(cmd, cwd=own_folder, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((own_folder / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["choices"]["client/objective"] == "feature_norm"
    assert (summary["method"], summary["method_name"]) == ("feature_norm", "FeatureNorm")  # the YAML's display_name
    assert summary["config"]["client"]["objective"]["beta"] == 0.01


def test_its_term_is_what_the_readme_says_and_it_reaches_training(own_folder, monkeypatch):
    """On a batch whose representations are (3, 4) and (0, 0): beta/2 × mean(25, 0). Trained, beta=0 is the task loss
    alone (plain training's numbers) and beta=5 moves them: the term is not silently left out."""
    monkeypatch.chdir(own_folder)
    monkeypatch.syspath_prepend(str(own_folder))
    from my_objectives.feature_norm import FeatureNorm

    assert fedagg.Objective is type(FeatureNorm()).__mro__[1] and fedagg.Sees(representation=True) == FeatureNorm.sees
    seen = fedagg.Seen(torch.tensor([0, 1]), Representation(
        torch.tensor([[3.0, 4.0], [0.0, 0.0]]), torch.zeros(2, 3)))
    assert FeatureNorm(beta=0.2).forward_term(seen).item() == pytest.approx(0.5 * 0.2 * 12.5)
    base = ["hydra.searchpath=[file://my_conf]", "rounds=2", "device=cpu", "engine=sequential"]
    plain = fedagg.run_experiment([*base[1:], "client/objective=none"], own_folder / "plain")
    zero = fedagg.run_experiment([*base, "client/objective=feature_norm", "client.objective.beta=0"], own_folder / "zero")
    five = fedagg.run_experiment([*base, "client/objective=feature_norm", "client.objective.beta=5"], own_folder / "five")

    def losses(name):
        rows = (own_folder / name / "metrics.csv").read_text().splitlines()[1:]
        header = (own_folder / name / "metrics.csv").read_text().splitlines()[0].split(",")
        return [float(r.split(",")[header.index("train_loss")]) for r in rows]

    assert losses("zero") == pytest.approx(losses("plain"), rel=1e-5)  # the same task loss: another forward path
    assert zero["final_test_acc"] == pytest.approx(plain["final_test_acc"], abs=1 / 360 + 1e-9)
    assert all(abs(a - b) > 1e-3 for a, b in zip(losses("five"), losses("plain")))


def test_an_option_that_is_not_found_says_an_own_one_needs_hydra_searchpath(own_folder, monkeypatch):
    from fedagg.run import explain_composition_error

    monkeypatch.chdir(own_folder)
    line = explain_composition_error(["client/objective=feature_norm"])
    assert line == ("client/objective=feature_norm is not an option (options: feddecorr, feddyn, fedlc, fedntd, fedprox, "
                    "moon, none); an option of your own needs its folder searched: client/objective/feature_norm.yaml "
                    "in DIR and hydra.searchpath=[file://DIR] on the command line")
    assert explain_composition_error(["client/objective=feature_norm", "hydra.searchpath=[file://my_conf]"]) is None
