"""Launcher, run folder, data and model settings that cannot make a run: one line each, before round 1."""

import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from fedagg import run_experiment
from fedagg.data.skew_partitions import pachinko
from fedagg.run import SetupError, explain_composition_error

STACKED = ["-m", "hydra/launcher=stacked", "engine=parallel", "seed=0,1"]


def run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "fedagg.run", *args], cwd=cwd, capture_output=True, text=True)


@pytest.mark.parametrize("value, allowed", [
    ("0", "it must be an integer >= 1 (the most jobs trained together)"),
    ("-1", "it must be an integer >= 1 (the most jobs trained together)"),
    ("2.5", "it must be an integer"),
    ("abc", "it must be an integer"),
])
def test_the_stacked_launchers_group_size_is_a_positive_integer(value, allowed):
    shown = "'abc'" if value == "abc" else value
    assert explain_composition_error([*STACKED, f"hydra.launcher.max_group={value}"]) == (
        f"hydra.launcher.max_group={shown} is not allowed; {allowed}")
    assert explain_composition_error([*STACKED, "hydra.launcher.max_group=3"]) is None


def test_a_run_or_sweep_folder_that_is_a_file_is_refused(tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("mine\n")
    assert explain_composition_error([f"hydra.run.dir={file}"]) == (
        f"hydra.run.dir={file} is not allowed: it is a file, not a folder; give a folder for the results")
    assert explain_composition_error([f"hydra.run.dir={file / 'run'}"]) == (
        f"hydra.run.dir={file / 'run'} is not allowed: it is inside {file}, a file, not a folder; give a folder for the "
        "results")
    assert explain_composition_error(["-m", "seed=0,1", f"hydra.sweep.dir={file}"]) == (
        f"hydra.sweep.dir={file} is not allowed: it is a file, not a folder; give a folder for the results")
    proc = run_cli("rounds=1", f"hydra.run.dir={file}")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", f"hydra.run.dir={file} is not allowed: it is a file, not a folder; give a folder for the results\n")
    assert file.read_text() == "mine\n"


def test_a_value_refused_on_the_command_line_is_shown_as_typed_in_one_line(tmp_path):
    proc = run_cli("rounds=1", "device=cpu", "channel=dp", "channel.dp.noise_multiplier=1e300",
                   f"hydra.run.dir={tmp_path / 'run'}")
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, lines
    assert "channel.dp.noise_multiplier=1e300 is not allowed; use 0 (no noise: ε = ∞) or a number in" in lines[0]


def test_pachinko_needs_a_coarse_table_for_labels_other_than_cifar100s(tmp_path):
    with pytest.raises(SetupError) as err:
        run_experiment(["rounds=1", "device=cpu", "partition=pachinko"], tmp_path / "run")
    assert str(err.value) == ("partition.coarse_of=null is not allowed: null means CIFAR-100's table of 100 fine labels "
                              "to 20 coarse ones, but these labels run 0..9; give each label's coarse label, e.g. "
                              "partition.coarse_of=[0,0,0,0,0,1,1,1,1,1]")
    summary = run_experiment(["rounds=1", "device=cpu", "partition=pachinko", "partition.samples_per_client=50",
                              "partition.coarse_of=[0,0,0,0,0,1,1,1,1,1]"], tmp_path / "given")
    assert summary["status"] == "completed"
    labels = torch.arange(100).repeat(3)  # CIFAR-100's 100 labels: its table applies
    assert sum(p.numel() for p in pachinko(labels, 3, generator=torch.Generator().manual_seed(0),
                                           samples_per_client=20)) == 60


def test_messages_spell_null_as_the_user_does(tmp_path):
    with pytest.raises(SetupError) as err:
        run_experiment(["rounds=1", "device=cpu", "num_clients=null"], tmp_path / "run")
    assert str(err.value).startswith("num_clients=null is only allowed with partition=natural")


def test_a_model_that_cannot_take_the_data_is_named_with_the_inputs_it_needs(tmp_path):
    with pytest.raises(SetupError) as err:
        run_experiment(["rounds=1", "device=cpu", "model=lstm_shakespeare"], tmp_path / "run")
    # the LSTM reads token sequences; its shape, (8,), would only echo the images' width
    assert str(err.value) == ("model LSTMShakespeare takes token sequences, but dataset 'digits' has images of "
                              "shape (1, 8, 8); choose a model built for images")


def test_a_junk_tff_file_is_named(tmp_path, monkeypatch):
    pytest.importorskip("h5py", reason="h5py not installed (pip install 'fedagg[natural]')")
    from fake_tff import FEMNIST_FILES, write_femnist
    from fedagg.data import leaf

    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "femnist" / "tff"
    write_femnist(folder)
    (folder / FEMNIST_FILES[1]).write_bytes(b"not an h5 file at all\n")
    with pytest.raises(ValueError) as err:
        leaf.femnist(str(tmp_path), mean=[0.0], std=[1.0])
    assert str(err.value).startswith(f"femnist: cannot read {folder / FEMNIST_FILES[1]} as TFF's h5 file (OSError: ")
    assert str(err.value).endswith("; fetch it again, or remove it and set data.download=true")
