"""Every check of a run comes before its first file, a folder whose run never completed a round holds no run, and a
failure's summary is written whatever the configuration holds."""

import json
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from conftest import ROOT, compose_config
from fedagg.aggregators.base import FedAvg
from fedagg.run import FolderHeld, SetupError, train
from fedagg.tracking.files import write_json

STRAGGLERS = ["system=stragglers", "system.work=epochs_code", "rounds=2"]
EPOCHS_LINE = ("system.work=epochs_code is not allowed with client.local_epochs=1; FedProx's code draws a straggler's "
               "epochs from 1..E-1, so it needs E >= 2 (or use epochs_text)")


def run_cli(folder, *overrides):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "fedagg.run", *overrides, f"hydra.run.dir={folder}"], cwd=ROOT,
                          env=env, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def last_message(output: str) -> str:
    return output.strip().splitlines()[-1].split("] - ", 1)[-1]


def files(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_budget_the_system_cannot_draw_is_one_line_before_any_file_and_blocks_nothing(tmp_path):
    folder = tmp_path / "run"
    rc, out = run_cli(folder, *STRAGGLERS, "client.local_epochs=1")
    assert rc == 2 and "Traceback" not in out and last_message(out) == EPOCHS_LINE
    assert files(folder) == ["run.log", "summary.json"]  # the refusal's line and summary; nothing of a run
    assert json.loads((folder / "summary.json").read_text())["error"] == f"ValueError: {EPOCHS_LINE}"
    rc, out = run_cli(folder, *STRAGGLERS, "client.local_epochs=2")  # the corrected command, in the same folder
    assert rc == 0, out[-2000:]
    summary = json.loads((folder / "summary.json").read_text())
    assert (summary["status"], summary["rounds_completed"], summary["config"]["client"]["local_epochs"]) == (
        "completed", 2, 2)


class FailsInRound(FedAvg):
    """FedAvg that breaks (a bug, not a setting) in round `at`."""

    at = 1

    def aggregate(self, inputs):
        if inputs.round == type(self).at:
            raise RuntimeError(f"broken in round {inputs.round}")
        return super().aggregate(inputs)


@pytest.fixture
def breaking(monkeypatch):
    def at(round_):
        monkeypatch.setattr(FailsInRound, "at", round_)
        return compose_config("rounds=2", "device=cpu", "num_clients=4", f"aggregator._target_={__name__}.FailsInRound")
    return at


def test_a_folder_whose_run_never_completed_a_round_holds_no_run(tmp_path, breaking):
    folder = tmp_path / "run"
    with pytest.raises(RuntimeError, match="broken in round 1"):
        train(breaking(1), folder)
    summary = json.loads((folder / "summary.json").read_text())
    assert (summary["status"], summary["rounds_completed"]) == ("failed", 0)
    assert {"config.yaml", "partition.json", "model.pt"} <= set(files(folder))  # what its setup wrote
    summary = train(compose_config("rounds=1", "device=cpu", "seed=3"), folder)
    assert (summary["status"], summary["seed"]) == ("completed", 3)
    assert OmegaConf.load(folder / "config.yaml").seed == 3  # its own files, nothing of the failed run's


def test_a_run_killed_before_its_first_round_blocks_nothing(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("config.yaml", "partition.json", "partition.png"):  # what the setup wrote; no summary
        (folder / name).write_text("left\n")
    assert train(compose_config("rounds=1", "device=cpu"), folder)["status"] == "completed"
    assert (folder / "partition.json").read_text() != "left\n"


def test_a_run_that_completed_a_round_before_failing_is_still_held(tmp_path, breaking):
    folder = tmp_path / "run"
    with pytest.raises(RuntimeError, match="broken in round 2"):
        train(breaking(2), folder)
    with pytest.raises(FolderHeld, match=r"holds a failed run \(seed=0, 1 round\); nothing was changed"):
        train(compose_config("rounds=1", "device=cpu"), folder)


def test_a_list_where_a_number_belongs_is_one_line_and_its_summary_is_written(tmp_path):
    folder = tmp_path / "run"
    rc, out = run_cli(folder, "seed=[0,1]", "rounds=1")
    assert rc == 2 and "Traceback" not in out and last_message(out) == "seed=[0, 1] is not allowed; it must be an integer"
    assert files(folder) == ["run.log", "summary.json"]  # no summary.json.tmp
    summary = json.loads((folder / "summary.json").read_text())
    assert (summary["status"], summary["seed"], summary["config"]["seed"]) == ("failed", [0, 1], [0, 1])
    assert "seed=[0, 1] is not allowed" in (folder / "run.log").read_text()
    with pytest.raises(SetupError, match=r"^experiment_scale=\[0.5, 1\] is not allowed; it must be a number$"):
        train(compose_config("experiment_scale=[0.5,1]"), tmp_path / "scale")
    assert json.loads((tmp_path / "scale" / "summary.json").read_text())["experiment_scale"] == [0.5, 1]


def test_a_value_json_cannot_hold_leaves_no_temp_file_and_a_failure_writes_it_anyway(tmp_path):
    path = tmp_path / "summary.json"
    with pytest.raises(TypeError, match="cannot write object to JSON"):
        write_json(path, {"a": object()})
    assert files(tmp_path) == []
    write_json(path, {"a": OmegaConf.create([0, 1]), "b": OmegaConf.create({"c": 2}), "d": {3}, "e": Ellipsis},
               lenient=True)
    assert json.loads(path.read_text()) == {"a": [0, 1], "b": {"c": 2}, "d": [3], "e": "Ellipsis"}


def test_a_resume_whose_files_changed_is_one_line_before_it_writes(tmp_path, breaking):
    """The checkpoint's own checks (the files as it left them) come before the resumed run rewrites config.yaml."""
    folder = tmp_path / "run"
    with pytest.raises(RuntimeError, match="broken in round 2"):
        train(OmegaConf.merge(breaking(2), {"checkpoint_every": 1}), folder)
    metrics = folder / "metrics.csv"
    metrics.write_text(metrics.read_text().replace("1,", "7,", 1))  # round 1's row changed after the checkpoint
    (folder / "config.yaml").write_text("# kept\n")
    cfg = OmegaConf.merge(breaking(99), {"checkpoint_every": 1, "resume": True})
    with pytest.raises(SetupError) as err:
        train(cfg, folder)
    assert str(err.value) == (f"{metrics} no longer holds the 1 rows the checkpoint recorded (it was changed or cut "
                              "short after it); resume needs the run's files as it left them, or start the run again "
                              "with overwrite=true")
    assert (folder / "config.yaml").read_text() == "# kept\n"
