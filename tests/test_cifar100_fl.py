"""dataset=cifar100_fl: CIFAR-100's files, Pachinko clients, ResNet-18-GN by default."""

import json

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from conftest import CONF, compose_config
from fake_datasets import write_cifar
from fedagg.run import train


def test_cifar100_fl_loads_the_cifar100_files_pixel_exact(tmp_path):
    want = write_cifar(tmp_path, hundred=True, per_file=6)
    node = OmegaConf.load(CONF / "dataset" / "cifar100_fl.yaml")
    node.pop("defaults")  # the partition it chooses for a run, not an argument of the loader
    bundle = instantiate(node)(root=str(tmp_path), verify_md5=False)
    assert bundle.name == "cifar100_fl" and bundle.num_classes == 100
    np.testing.assert_array_equal(bundle.train_x.numpy(), want["train_x"])
    np.testing.assert_array_equal(bundle.train_y.numpy(), want["train_y"])
    np.testing.assert_array_equal(bundle.test_x.numpy(), want["test_x"])


@pytest.mark.slow  # two runs of an 11M-parameter ResNet on the CPU
@pytest.mark.parametrize("engine", ["sequential", "parallel"])
def test_two_rounds_of_pachinko_clients_train_the_default_resnet18_gn(tmp_path, engine):
    write_cifar(tmp_path / "data", hundred=True, per_file=60)
    overrides = ["dataset=cifar100_fl", "dataset.verify_md5=false", f"data.root={tmp_path / 'data'}", "device=cpu",
                 "partition=pachinko", "partition.samples_per_client=10", "num_clients=3", "rounds=2",
                 "client.batch_size=10", f"engine={engine}"]
    choices = {"dataset": "cifar100_fl", "partition": "pachinko"}
    summary = train(compose_config(*overrides), tmp_path / "run", choices)
    assert summary["status"] == "completed" and summary["choices"]["model"] == "resnet18_gn"
    part = json.loads((tmp_path / "run" / "partition.json").read_text())
    assert [c["size"] for c in part["clients"]] == [10, 10, 10]
    assert torch.isfinite(torch.tensor(summary["final_test_acc"]))
