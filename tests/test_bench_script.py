"""scripts/bench.py builds its models and datasets in Python; they must stay what the YAML options give."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_script", ROOT / "scripts" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name,shape", [("cnn_small", (1, 28)), ("lenet", (1, 28)), ("resnet20", (3, 32)),
                                        ("mlp", (1, 8)), ("mlr", (1, 28)), ("lstm_shakespeare", (1, 80))])
def test_models_are_the_yaml_options(name, shape):
    bench = load_bench()
    kw = dict(num_classes=10, in_channels=shape[0], image_size=shape[1])
    torch.manual_seed(0)
    ours = bench.MODELS[name](**kw)
    torch.manual_seed(0)
    theirs = instantiate(OmegaConf.load(ROOT / "conf" / "model" / f"{name}.yaml"))(**kw)
    assert type(ours) is type(theirs)
    assert str(ours) == str(theirs)  # the same layers, sizes and options (shortcut, hidden width)
    for (k, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("name", ["mnist", "cifar10", "digits"])
def test_normalisation_is_the_dataset_yaml(name):
    yaml = OmegaConf.load(ROOT / "conf" / "dataset" / f"{name}.yaml")
    ours = load_bench().NORMALISATION[name]
    assert ours["mean"] == pytest.approx(list(yaml.mean), abs=0) and ours["std"] == pytest.approx(list(yaml.std), abs=0)
    assert ours["augment"] is bool(yaml.augment)


def test_bench_imports_no_hydra():
    text = (ROOT / "scripts" / "bench.py").read_text()
    assert "hydra" not in text.replace("no YAML", "") and "omegaconf" not in text.lower()
