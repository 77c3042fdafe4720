"""What a client objective contributes is derived from the hooks it overrides: an own objective is never silently
dropped, neither beside a method's own client half (refused in one line) nor on the engines' plain-logits path."""

import csv
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, compose_config
from fedagg.clients.objectives import Objective, Sees
from fedagg.run import train

FEDRS = '''\
import torch

from fedagg.clients.objectives import Objective, Sees


class FedRS(Objective):
    """Restricted softmax: the logits of the classes a client lacks are scaled by alpha."""

    sees = Sees(label_counts=True)

    def __init__(self, alpha: float = 0.5) -> None:
        self.alpha = alpha

    def task_logits(self, seen):
        logits = seen.local.logits
        return torch.where(seen.label_counts > 0, logits, self.alpha * logits)
'''


@pytest.fixture
def own_objective(tmp_path):
    (tmp_path / "my_objectives").mkdir()
    (tmp_path / "my_objectives" / "fedrs.py").write_text(FEDRS)
    conf = tmp_path / "my_conf" / "client" / "objective"
    conf.mkdir(parents=True)
    (conf / "fedrs.yaml").write_text("_target_: my_objectives.fedrs.FedRS\ndisplay_name: FedRS\nalpha: 0.5\n")
    return tmp_path


def run_cli(folder, *overrides):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([".", str(ROOT)]), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "fedagg.run", "client/objective=fedrs", "hydra.searchpath=[file://my_conf]",
                           "rounds=1", "num_clients=4", *overrides], cwd=folder, env=env, capture_output=True, text=True)


def test_an_own_task_logits_beside_scaffold_is_refused_in_one_line(own_objective):
    proc = run_cli(own_objective, "aggregator=scaffold", "hydra.run.dir=run")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-2000:]
    assert "Traceback" not in output
    assert output.strip().splitlines()[-1].endswith(
        "[ERROR] - aggregator=scaffold brings its own client half (ScaffoldClient); client objective FedRS cannot be "
        "added to it: use client/objective=none")
    assert not any((own_objective / "run" / name).exists() for name in ("metrics.csv", "model.pt", "config.yaml"))


class Silenced(Objective):
    """Declares nothing it reads, yet takes the task loss of all-zero logits: its loss is log C whatever the
    weights, with a gradient of exactly zero, so local training moves nothing."""

    def task_logits(self, seen):
        return seen.local.logits * 0.0


class Ignored(Objective):
    adds_to_loss = False  # a flag set by hand is replaced by what the class overrides

    def penalty(self, params, anchor, state):
        return None


def test_what_an_objective_contributes_is_derived_from_its_overrides():
    assert (Silenced.overrides, Silenced.adds_to_loss, Silenced.on_forward, Silenced.personal) == (
        frozenset({"task_logits"}), True, True, False)
    assert Silenced().reads_forward and not Silenced.sees.forward
    assert Ignored.adds_to_loss and not Ignored.on_forward and not Ignored().reads_forward
    assert (Objective.overrides, Objective.adds_to_loss, Objective().reads_forward) == (frozenset(), False, False)

    class Own(Objective):
        sees = Sees(label_counts=True)

        def start(self, client_id, params, buffers):
            return params, buffers

    assert Own.personal and not Own.adds_to_loss and Own().reads_forward  # its sees still counts


@pytest.mark.parametrize("engine", ["sequential", "parallel"])
def test_task_logits_of_an_objective_that_declares_nothing_are_trained_with(tmp_path, engine):
    cfg = compose_config("rounds=1", "num_clients=3", f"engine={engine}", f"client.objective._target_={__name__}.Silenced")
    summary = train(cfg, tmp_path)
    assert summary["status"] == "completed"
    with open(tmp_path / "metrics.csv") as f:
        row = next(csv.DictReader(f))
    assert float(row["update_norm"]) == 0.0 and float(row["client_update_norm"]) == 0.0
    assert float(row["train_loss"]) == pytest.approx(torch.log(torch.tensor(10.0)).item(), rel=1e-6)  # log C, C = 10
