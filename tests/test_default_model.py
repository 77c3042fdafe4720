"""Each dataset names its default backbone (`default_model` in its YAML); a chosen model always wins."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict
from torch import nn

from conftest import CONF, ROOT, compose_config
from fedagg.data.device import DeviceData
from fedagg.edge.default_model import with_default_model
from fedagg.loop.assembly import check_fits
from fedagg.models.simple import MLP

DEFAULTS = {"digits": "mlp", "mnist": "cnn_mnist", "fmnist": "cnn_mnist", "cifar10": "resnet20",
            "cifar100": "resnet20", "cifar100_fl": "resnet18_gn", "tinyimagenet": "resnet18", "imagenet": "resnet18"}


def test_every_dataset_yaml_names_its_default():
    for dataset, model in DEFAULTS.items():
        assert OmegaConf.load(CONF / "dataset" / f"{dataset}.yaml").default_model == model, dataset


@pytest.mark.parametrize("dataset", ["digits", "cifar100"])  # composing is ~1 s each; the rest: the YAML test above
def test_each_dataset_trains_its_papers_backbone_when_no_model_is_chosen(dataset):
    model = DEFAULTS[dataset]
    choices = {"dataset": dataset}
    cfg = compose_config(f"dataset={dataset}")
    assert "model" not in cfg  # conf/config.yaml: model: null
    filled, note = with_default_model(cfg, choices)
    assert OmegaConf.to_container(filled.model) == OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{model}.yaml"))
    assert choices == {"dataset": dataset, "model": model}
    assert note == f"model={model}: the default for dataset={dataset}; model=NAME to choose another"
    assert "model" not in cfg  # the caller's config is left as it was
    instantiate(filled.dataset)  # the loader takes (and ignores) default_model: the node instantiates as it is


def test_the_default_model_is_read_once_per_process_and_handed_out_as_a_copy(monkeypatch):
    from fedagg.edge import default_model

    read = []
    real = default_model._read_or_compose
    monkeypatch.setattr(default_model, "_read_or_compose", lambda name: read.append(name) or real(name))
    monkeypatch.setattr(default_model, "compose", lambda **kw: pytest.fail("a model file that stands alone is read"))
    default_model._composed_model_node.cache_clear()
    cfg = compose_config("dataset=digits")
    first, _ = with_default_model(cfg, {"dataset": "digits"})
    first.model.hidden = 7  # a run that changes its copy changes no other run's
    second, _ = with_default_model(cfg, {"dataset": "digits"})
    assert read == ["mlp"]
    assert OmegaConf.to_container(second.model) == OmegaConf.to_container(OmegaConf.load(CONF / "model" / "mlp.yaml"))
    default_model._composed_model_node.cache_clear()


def test_every_model_file_reads_as_composing_model_name_gives():
    from hydra import compose, initialize_config_dir

    from fedagg.edge.default_model import _read_or_compose

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for path in sorted((CONF / "model").glob("*.yaml")):
            composed = compose(config_name="config", overrides=[f"model={path.stem}"]).model
            assert OmegaConf.to_yaml(_read_or_compose(path.stem)) == OmegaConf.to_yaml(composed), path.stem


def test_a_model_file_with_a_defaults_list_is_composed(tmp_path):
    from hydra import initialize_config_dir

    from fedagg.edge.default_model import _read_or_compose

    (tmp_path / "model").mkdir()
    (tmp_path / "config.yaml").write_text("defaults:\n  - model: null\n  - _self_\n")
    (tmp_path / "model" / "base.yaml").write_text("width: 3\nact: relu\n")
    (tmp_path / "model" / "wide.yaml").write_text("defaults:\n  - base\n  - _self_\nwidth: 9\ndepth: 2\n")
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        assert OmegaConf.to_container(_read_or_compose("wide")) == {"width": 9, "act": "relu", "depth": 2}
        assert OmegaConf.to_container(_read_or_compose("base")) == {"width": 3, "act": "relu"}


def test_a_chosen_model_wins_and_a_dataset_without_a_default_is_one_line():
    cfg = compose_config("dataset=cifar100", "model=cnn")
    choices = {"dataset": "cifar100", "model": "cnn"}
    assert with_default_model(cfg, choices) == (cfg, None) and choices["model"] == "cnn"
    with open_dict(cfg):
        del cfg["model"]
        del cfg.dataset["default_model"]
    with pytest.raises(ValueError) as err:
        with_default_model(cfg, {"dataset": "cifar100"})
    assert str(err.value) == ("model is not set and dataset=cifar100 names no default_model: choose a backbone with "
                              "model=NAME (the options are the files in conf/model/)")
    with open_dict(cfg):
        cfg.dataset["default_model"] = "resnet99"
    with pytest.raises(ValueError, match=r"^dataset\.default_model='resnet99' of dataset=cifar100 is not a model; "
                                         r"choose one of (\w+, )*cnn, .*resnet20, "):
        with_default_model(cfg, {"dataset": "cifar100"})


def test_experiment_files_keep_their_own_model():
    # comparison_mnist's single run trains its MLP row, not MNIST's default CNN
    cfg = compose_config("+experiment=comparison_mnist")
    assert cfg.model._target_ == "fedagg.models.simple.MLP"


class _Sequence(nn.Module):
    """Stands for a text model: token ids through an embedding, which float images cannot index."""

    def __init__(self):
        super().__init__()
        self.input_shape = (1, 8, 8)
        self.embed = nn.Embedding(80, 8)

    def forward(self, x):
        return self.embed(x)


def test_a_model_that_cannot_take_the_dataset_is_one_line_before_training():
    x = torch.zeros(4, 1, 8, 8, dtype=torch.uint8)
    bundle = SimpleNamespace(name="digits", num_classes=10, augment=False, train_x=x, train_y=torch.zeros(4).long(),
                             test_x=x, test_y=torch.zeros(4).long(), mean=(0.5,), std=(0.25,))
    model = _Sequence()
    with pytest.raises(ValueError) as err:
        check_fits(model, DeviceData(bundle, torch.device("cpu"), model.input_shape))
    assert str(err.value).startswith("model _Sequence cannot take dataset digits's inputs of shape (1, 8, 8): ")
    assert str(err.value).endswith("; choose another model=NAME") and "\n" not in str(err.value)
    fits = MLP(num_classes=10, in_channels=1, image_size=8)
    fits.train()
    check_fits(fits, DeviceData(bundle, torch.device("cpu"), fits.input_shape))
    assert fits.training  # the probe leaves the mode as it found it


@pytest.mark.slow  # two subprocesses
def test_command_line_logs_the_default_and_why_and_a_model_key_without_a_model_is_one_line(tmp_path):
    run = subprocess.run([sys.executable, "-m", "fedagg.run", "rounds=1", "device=cpu", f"hydra.run.dir={tmp_path / 'a'}"],
                         cwd=ROOT, capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", "PATH": ""})
    assert run.returncode == 0, run.stderr
    said = [line.split(" - ", 1)[1] for line in (run.stdout + run.stderr).splitlines() if "][fedagg][" in line]
    assert said[0] == ("digits: 1437 train / 360 test samples, 10 clients, MLP with 4810 parameters on cpu "
                       "(model=mlp: the default for dataset=digits; model=NAME to choose another)")
    bad = subprocess.run([sys.executable, "-m", "fedagg.run", "model.hidden=32", f"hydra.run.dir={tmp_path / 'b'}"],
                         cwd=ROOT, capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", "PATH": ""})
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == ("model.hidden=32 is not allowed without model=NAME: no model is chosen here (a dataset's "
                          "default backbone is chosen after the command line is read); name it, e.g. "
                          "model=cnn_small model.hidden=32 (model=cnn_small, lstm_shakespeare, mlp have hidden)\n")
    assert not (tmp_path / "b").exists()
