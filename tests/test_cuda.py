"""On a GPU: both engines, their equivalence, bf16, channels-last, every backbone, the data path, determinism,
per-client state on the host, and checkpoints across devices. Marked `cuda`: collected everywhere, skipped
without a GPU (`python -m pytest -m cuda` runs them; scripts/gpu_check.sh with the benchmark)."""

from types import SimpleNamespace

import pytest
import torch

from conftest import compose_config
from fedagg.data.device import DeviceData
from fedagg.clients.trainer import LocalSGD
from fedagg.engines.base import RoundJob
from fedagg.engines import memory
from fedagg.engines.parallel import ParallelEngine
from fedagg.engines.sequential import SequentialEngine
from fedagg.models.flat import get_buffers, get_params
from fedagg.run import train
from fedagg.runtime.numerics import numerics

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _rows(path):
    import csv

    with open(path) as f:
        return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in csv.DictReader(f)]


@pytest.mark.parametrize("engine", ["sequential", "parallel"])
def test_a_run_on_the_gpu(tmp_path, engine):
    summary = train(compose_config("rounds=3", "device=cuda", f"engine={engine}"), tmp_path)
    assert summary["status"] == "completed" and summary["device"] == "cuda" and summary["final_test_acc"] > 0.5


def test_auto_runs_the_parallel_engine_with_a_chunk_from_gpu_memory():
    from conftest import compose_config as cc
    from hydra.utils import instantiate

    from fedagg.models.resnet_imagenet import ResNet18

    from fedagg.engines.choice import RoundShape

    engine, _ = instantiate(cc("device=cuda").engine).for_run(RoundShape(1, "conv", 11_000_000, 64, "cuda"))
    assert type(engine) is ParallelEngine and engine.chunk_size == "auto"
    model = ResNet18(num_classes=200, in_channels=3, image_size=64).cuda()
    sample = torch.randn(3, 64, 64, device="cuda")
    small = memory.auto_chunk_size(model, sample, 64, 20, 0)
    tiny = memory.auto_chunk_size(model, sample, 8, 20, 0)
    assert 1 <= small < tiny <= memory.MAX_CHUNK  # smaller batches: more clients at once


@pytest.mark.parametrize("case", ["mlp", "cnn", "resnet20"])
def test_parallel_matches_sequential_on_the_gpu(case):
    from test_parallel_engine import CASES, TOL, _rel, _setup

    model_cls, channels, size, sizes, augment, trainer_kw, objective, engine_kw = CASES[case]
    model, cpu, clients = _setup(model_cls, channels, size, sizes, augment)
    model = model.cuda()
    bundle = SimpleNamespace(name="toy", num_classes=10, augment=augment, train_x=cpu.train_x.cpu(),
                             train_y=cpu.train_y.cpu(), test_x=cpu.test_x.cpu(), test_y=cpu.test_y.cpu(),
                             mean=(0.5,) * channels, std=(0.25,) * channels)
    data = DeviceData(bundle, torch.device("cuda"), model.input_shape)
    clients = [type(c)(c.id, c.train_idx.cuda(), c.val_idx.cuda()) for c in clients]
    start = get_params(model), get_buffers(model)
    outs = []
    for engine in (SequentialEngine(), ParallelEngine(**engine_kw)):
        trainer = LocalSGD(**trainer_kw, objective=objective())
        with numerics(deterministic=False, tf32=False):  # a run's fp32 switches: cuDNN's own default is TF32
            outs.append(engine.train_round(RoundJob(model, trainer, data, clients, start[0].clone(),
                                                    start[1].clone(), lr=trainer_kw["lr"], seed=3, round=1)))
    for k in range(len(clients)):
        assert _rel(outs[1].params[k], outs[0].params[k]) < TOL


def test_bf16_and_channels_last_on_the_gpu(tmp_path):
    for extra in (["engine.precision=bf16"], ["engine.channels_last=true"]):
        summary = train(compose_config("rounds=2", "device=cuda", "engine=parallel", "model=resnet20",
                                       "client.local_epochs=1", *extra), tmp_path / extra[0])
        assert summary["status"] == "completed"


@pytest.mark.parametrize("name", ["mlr", "mlp", "lenet", "cnn", "cnn_mnist", "cnn_small", "cnn_fednnnn_mnist",
                                  "cnn_fednnnn_cifar", "resnet20", "resnet32", "resnet18", "resnet34"])
def test_every_backbone_runs_forward_and_backward_on_the_gpu(name):
    from hydra.utils import instantiate

    model = instantiate(compose_config(f"model={name}").model)(num_classes=10, in_channels=3, image_size=32).cuda()
    x = torch.randn(4, *model.input_shape, device="cuda")
    model(x).sum().backward()
    assert all(p.grad is not None and p.grad.is_cuda for p in model.parameters())


def test_the_data_path_stays_on_the_gpu(tmp_path):
    from fake_datasets import write_cifar

    write_cifar(tmp_path / "data", per_file=40)
    summary = train(compose_config("rounds=1", "device=cuda", "dataset=cifar10", f"data.root={tmp_path / 'data'}",
                                   "dataset.verify_md5=false", "model=resnet20", "num_clients=4", "partition=iid"),
                    tmp_path / "run")
    assert summary["status"] == "completed"


def test_deterministic_runs_repeat_exactly_on_the_gpu(tmp_path):
    overrides = ["rounds=2", "device=cuda", "deterministic=true", "model=resnet20", "client.local_epochs=1"]
    train(compose_config(*overrides), tmp_path / "a")
    train(compose_config(*overrides), tmp_path / "b")
    assert _rows(tmp_path / "a" / "metrics.csv") == _rows(tmp_path / "b" / "metrics.csv")


def test_per_client_state_stays_on_the_host(tmp_path):
    train(compose_config("rounds=2", "device=cuda", "aggregator=scaffold", "client.momentum=0.9",
                         "client.keep_optimizer_state=true", "clients_per_round=4"), tmp_path)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["trainer"]
    assert all(v.device.type == "cpu" for v in state["objective"]["variates"]["inline"].values())
    assert all(v.device.type == "cpu" for v in state["optimizer_states"]["inline"].values())
    assert len(state["optimizer_states"]["inline"]) >= 4


def test_a_gpu_checkpoint_resumes_on_the_gpu_and_is_refused_on_the_cpu(tmp_path):
    overrides = ["rounds=4", "checkpoint_every=2", "deterministic=true"]
    reference = train(compose_config(*overrides, "device=cuda"), tmp_path / "reference")
    run = tmp_path / "run"
    train(compose_config(*overrides, "device=cuda"), run)
    (run / "summary.json").unlink()
    with pytest.raises(ValueError, match="resume=true on cpu, but the run started on cuda"):
        train(compose_config(*overrides, "device=cpu", "resume=true"), run)
    resumed = train(compose_config(*overrides, "device=cuda", "resume=true"), run)
    assert resumed["final_test_acc"] == reference["final_test_acc"]


def test_validation_batches_and_fedlaw_epochs_need_no_host_sync():
    from fedagg.aggregators.fedlaw import FedLAW
    from fedagg.clients.validation import ValidationPlan

    vals = [torch.arange(3, device="cuda"), torch.arange(50, 57, device="cuda")]
    plan = ValidationPlan(vals, batch_size=4)
    labels = torch.arange(60, device="cuda") % 3
    correct = torch.zeros(2, dtype=torch.long, device="cuda")
    epochs = FedLAW(server_epochs=5, server_batch_size=8).batches(30, torch.Generator().manual_seed(1), "cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        for idx, real in plan:
            logits = torch.nn.functional.one_hot(labels[idx], 3).float()
            correct += plan.correct(logits, labels[idx], real)
        acc = plan.accuracy(correct)
        sizes = [b.shape for e in epochs for b in e]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert acc.tolist() == [1.0, 1.0] and len(sizes) == 5 * 4
