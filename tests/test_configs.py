"""Every YAML of every config group composes into the main config and instantiates."""


import pytest
from hydra.utils import instantiate
from torch import nn

from conftest import CONF, compose_config
from fedagg.aggregators.base import Aggregator
from fedagg.clients.trainer import LocalSGD
from fedagg.attacks.base import Attack
from fedagg.channel import Channel
from fedagg.models.adapters import NoAdapter
from fedagg.system.base import System
from fedagg.sampling.base import Sampler
from fedagg.tracking.base import Tracker

GROUPS = ("dataset", "partition", "model", "aggregator", "client", "logger", "engine", "system", "attack", "channel",
          "sampler", "server", "adapter")
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))]


def test_every_group_has_options():
    assert {g for g, _ in OPTIONS} == set(GROUPS)


@pytest.mark.parametrize("group, option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_instantiates(group, option):
    cfg = compose_config(f"{group}={option}")
    obj = instantiate(cfg[group])
    if group == "model" and option == "hf":  # names no model until model.name_or_path is given
        with pytest.raises(ValueError, match=r"^model.name_or_path is not set; give a Hugging Face model name"):
            obj(num_classes=10, in_channels=3, image_size=32)
    elif group == "model":
        model = obj(num_classes=10, in_channels=3, image_size=32)
        # a sequence model's input is (length,): its token ids
        sequence = option in ("lstm_shakespeare", "char_decoder", "text_decoder")
        assert isinstance(model, nn.Module) and len(model.input_shape) == (1 if sequence else 3)
    elif group == "aggregator":
        assert isinstance(obj, Aggregator)
    elif group == "client":
        assert isinstance(obj, LocalSGD)
    elif group == "logger":
        assert isinstance(obj, Tracker)
    elif group == "system":
        assert isinstance(obj, System)
    elif group == "attack":
        assert isinstance(obj, Attack)
    elif group == "sampler":
        assert isinstance(obj, Sampler)
    elif group == "channel":
        # `attack` names only the attack's place, which every chain has
        assert isinstance(obj, Channel) and len(obj.stages) == (option not in ("none", "attack"))
    elif group == "adapter":
        assert isinstance(obj, NoAdapter) and (type(obj) is NoAdapter) == (option == "none")
    elif group == "server":
        assert obj.asynchronous == (option == "async") and callable(obj.drive)
    elif group in ("dataset", "partition"):
        assert callable(obj)  # partials: the loader needs data.root, the partition needs labels
    else:
        assert hasattr(obj, "train_round")


def test_defaults_are_the_documented_ones():
    cfg = compose_config()
    assert cfg.dataset._target_.endswith(".digits")
    assert cfg.partition._target_.endswith(".dirichlet") and cfg.partition.alpha == 0.5
    assert cfg.num_clients == 10 and cfg.clients_per_round is None
    assert cfg.aggregator._target_.endswith("FedAvg")
