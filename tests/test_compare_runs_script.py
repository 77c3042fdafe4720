"""scripts/compare_runs.py, the check that a refactor changed no result, on folders written by a real run."""

import shutil
import subprocess
import sys
from pathlib import Path

import torch

from fedagg import run_experiment

ROOT = Path(__file__).resolve().parents[1]


def compare(before: Path, after: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_runs.py"), str(before), str(after)],
                          capture_output=True, text=True)


def test_identical_runs_pass_and_each_kind_of_change_is_named(tmp_path):
    before = tmp_path / "before"
    # the bundled digits: a real run's files on any machine, no dataset folder needed
    run_experiment(["experiment_scale=0.1", "rounds=30", "num_clients=4", "clients_per_round=2", "model=mlr"],
                   before / "fedavg")
    after = tmp_path / "after"
    shutil.copytree(before, after)
    out = compare(before, after)
    assert out.returncode == 0 and "fedavg: identical" in out.stdout and "1 of 1 runs identical" in out.stdout

    state = torch.load(after / "fedavg" / "model.pt")
    name = next(iter(state))
    state[name] = state[name] + 1e-6  # one rounding's worth
    torch.save(state, after / "fedavg" / "model.pt")
    out = compare(before, after)
    assert out.returncode == 1 and f"model.pt: {name} max |diff| 1e-06" in out.stdout

    shutil.rmtree(after / "fedavg")
    out = compare(before, after)
    assert out.returncode == 1 and "0 of 1 runs identical" in out.stdout
