"""python -m fedagg.pretrain: a base trained centrally on some classes of the bundled digits, written as a base
file, and a federated run that starts from it (model.pretrained); its refusals before any training."""

import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from fedagg.data.datasets import digits
from fedagg.data.device import DeviceData
from fedagg.edge.pretrain_line import Refusal, run
from fedagg.models.pretrained import read_base
from fedagg.models.vit import ViT
from fedagg.pretrain.central import accuracy, chosen
from fedagg.run import run_experiment

SMALL = ["model=vit_tiny", "model.patch_size=2", "model.dim=16", "model.depth=1", "device=cpu"]
ARCH = dict(patch_size=2, dim=16, depth=1)


def _digits():
    return digits(mean=[0.3054], std=[0.3760])


def test_a_base_trains_on_the_chosen_classes_and_records_what_it_scores(tmp_path):
    lines = []
    out = run([*SMALL, f"out={tmp_path / 'base.pt'}", "epochs=2", "classes=[0,1,2,3,4]", "lr=0.003", "batch_size=16"],
              say=lines.append)
    base = read_base(out)
    bundle = _digits()
    assert base["source"]["samples"] == int((bundle.train_y < 5).sum())  # only the chosen classes trained
    assert base["source"]["test_samples"] == int((bundle.test_y < 5).sum())
    assert base["arch"]["input_size"] == 8 and base["source"]["classes"] == [0, 1, 2, 3, 4]
    assert len([line for line in lines if line.startswith("epoch ")]) == 2
    torch.manual_seed(5)
    model = ViT(num_classes=10, in_channels=1, image_size=8, pretrained=str(out), **ARCH)
    data = DeviceData(bundle, torch.device("cpu"), model.input_shape)
    assert accuracy(model, data, chosen(data.test_y, [0, 1, 2, 3, 4])) == base["source"]["test_acc"]
    assert base["source"]["test_acc"] > 0.5  # five classes: chance is 0.2; two epochs of AdamW pass 0.5


def test_a_federated_run_starts_from_the_base(tmp_path):
    out = run([*SMALL, f"out={tmp_path / 'base.pt'}", "epochs=1", "lr=0.003"], say=lambda line: None)
    torch.manual_seed(5)
    model = ViT(num_classes=10, in_channels=1, image_size=8, pretrained=str(out), **ARCH)
    data = DeviceData(_digits(), torch.device("cpu"), model.input_shape)
    base_acc = accuracy(model, data, torch.arange(len(data.test_y)))
    # a learning rate too small to move a prediction: the global model stays the base
    summary = run_experiment([*SMALL, f"model.pretrained={out}", "rounds=1", "num_clients=2", "client.lr=1e-9"],
                             tmp_path / "run")
    assert summary["status"] == "completed" and summary["final_test_acc"] == pytest.approx(base_acc, abs=1e-9)


def test_the_adapters_start_up_line_names_the_base_file_the_model_loaded(tmp_path, caplog):
    out = run([*SMALL, f"out={tmp_path / 'base.pt'}", "epochs=1", "lr=0.003"], say=lambda line: None)
    with caplog.at_level("INFO", logger="fedagg"):
        run_experiment([*SMALL, f"model.pretrained={out}", "adapter=lora", "aggregator=fedit", "rounds=1",
                        "num_clients=2"], tmp_path / "run")
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("LoRA adapters"))
    assert line.endswith(f"values, from {out})") and "seeded" not in line


def test_refusals_come_before_any_training(tmp_path):
    (tmp_path / "kept.pt").write_bytes(b"the user's own")
    cases = {
        "out is not set": [*SMALL],
        "exists; choose another file, or overwrite=true": [*SMALL, f"out={tmp_path / 'kept.pt'}"],
        "model=cnn cannot be written as a base": ["model=cnn", f"out={tmp_path / 'b.pt'}"],
        "classes=[0, 10] is not allowed; use a list of labels from 0 to 9": [*SMALL, f"out={tmp_path / 'b.pt'}",
                                                                          "classes=[0,10]"],
        "epochs=0 is not allowed": [*SMALL, f"out={tmp_path / 'b.pt'}", "epochs=0"],
        "model is not set": [f"out={tmp_path / 'b.pt'}"],
    }
    for words, argv in cases.items():
        with pytest.raises(Refusal, match=words.replace("[", r"\[").replace("]", r"\]")):
            run(argv, say=pytest.fail)  # nothing trains: say() is never reached
    assert (tmp_path / "kept.pt").read_bytes() == b"the user's own" and not (tmp_path / "b.pt").exists()


def test_the_command_line_is_one_line_for_a_mistyped_key(tmp_path):
    cli = subprocess.run([sys.executable, "-m", "fedagg.pretrain", *SMALL, f"out={tmp_path / 'b.pt'}", "epochz=2"],
                         cwd=ROOT, capture_output=True, text=True)
    assert cli.returncode == 2 and cli.stderr.count("\n") == 1 and "Traceback" not in cli.stderr
    assert "epochz is not a setting" in cli.stderr and "own keys: out, epochs" in cli.stderr


def test_a_char_decoder_base_from_shakespeare_scores_every_position(tmp_path, monkeypatch):
    from fake_leaf import write_shakespeare

    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache"))
    write_shakespeare(tmp_path / "data", sizes=(10, 16, 7))
    out = run(["model=char_decoder", "model.dim=16", "model.depth=1", "dataset=shakespeare",
               f"data.root={tmp_path / 'data'}", f"out={tmp_path / 'base.pt'}", "device=cpu"], say=lambda line: None)
    base = read_base(out)
    assert base["arch"]["length"] == 80 and base["arch"]["vocab"] == base["num_classes"]
    # LEAF's 80/20 split in time order of the 10, 16 and 7 samples: 8 + 12 + 5 train, 80 positions each scored
    assert base["source"]["samples"] == 25 and base["source"]["test_samples"] == 8
    summary = run_experiment(["model=char_decoder", "model.dim=16", "model.depth=1", f"model.pretrained={out}",
                              "dataset=shakespeare", f"data.root={tmp_path / 'data'}", "num_clients=null", "rounds=1",
                              "client.lr=1e-9", "device=cpu"], tmp_path / "run")
    assert summary["final_test_acc"] == pytest.approx(base["source"]["test_acc"], abs=1e-9)
