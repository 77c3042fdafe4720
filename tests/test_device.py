"""What a first GPU run would hit, shown on the CPU where it can be: random state, devices, compile."""

import pytest
import torch
import torch._dynamo

from conftest import compose_config
from fedagg.clients.forward import ClientInputs, RunInputs
from fedagg.clients.trainer import LocalSGD
from fedagg.engines import _packed
from fedagg.engines.parallel import ParallelEngine
from fedagg.runtime import checkpoints
from fedagg.loop.splits import build_model
from fedagg.models.cnns import CNNSmall
from fedagg.models.simple import MLP
from fedagg.run import train


def test_checkpoints_keep_no_random_state_of_other_gpus(monkeypatch):
    state = checkpoints.rng_state()
    assert set(state) <= {"torch", "cuda_current"}  # never one state per visible GPU
    # a checkpoint written with another GPU's state restores on a machine without it
    checkpoints.set_rng_state({"torch": torch.get_rng_state(), "cuda": [torch.zeros(8, dtype=torch.uint8)] * 4})


def test_the_initial_model_touches_no_gpu_generator(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the GPU generators were reseeded")

    monkeypatch.setattr(torch.cuda, "manual_seed_all", refuse)
    monkeypatch.setattr(torch.cuda, "manual_seed", refuse)
    bundle = type("B", (), {"num_classes": 10, "in_channels": 1, "image_size": 8})()
    a, b = (build_model(lambda **kw: MLP(**kw), bundle, 3, torch.device("cpu")) for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))  # still seeded


def test_a_run_records_its_device_and_refuses_to_resume_on_another(tmp_path):
    summary = train(compose_config("rounds=2", "device=cpu", "checkpoint_every=1"), tmp_path)
    assert summary["device"] == "cpu"
    assert all(v.device.type == "cpu" for v in torch.load(tmp_path / "model.pt").values())
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    ckpt["summary"]["device"] = "cuda"  # as if it had started on a GPU with device=cuda, which its config records
    ckpt["summary"]["config"]["device"] = "cuda"
    ckpt["summary"]["config"]["engine"]["device"] = "cuda"
    torch.save(ckpt, tmp_path / "checkpoint.pt")
    (tmp_path / "summary.json").unlink()
    with pytest.raises(ValueError, match=r"^resume=true on cpu, but the run started on cuda, where its random streams "
                                         r"differ: resume it with device=cuda"):
        train(compose_config("rounds=2", "device=cpu", "checkpoint_every=1", "resume=true"), tmp_path)


def test_the_per_client_convolution_loop_is_for_the_cpu_only(monkeypatch):
    calls = []
    monkeypatch.setattr(_packed.F, "conv2d", lambda *a, **k: calls.append(a[0].device.type) or torch.zeros(1))
    x = torch.zeros(2, 64, 1, 8, 8)  # 2 clients, batches of 64 one-channel images: the loop's case
    w = torch.zeros(2, 4, 1, 3, 3)
    _packed._conv_packed(2, (0, 0, None), x, w, None, 1, 1, 1, 1, False)
    assert calls == ["cpu", "cpu"]  # one call per client on the CPU; a GPU tensor takes the grouped path


@pytest.mark.parametrize("model", [MLP])
def test_compile_traces_the_stacked_step_as_one_graph(model):
    """engine.compile compiles: dynamo traces the vmapped forward (and objective term) of the packed model in one graph, no breaks."""
    net = model(num_classes=10, in_channels=1, image_size=8)
    engine = ParallelEngine()
    engine._prepare_model(net)
    engine._trainer = LocalSGD()
    k = 3
    params = [p.detach().unsqueeze(0).repeat(k, *[1] * p.dim()) for p in net.parameters()]
    x = torch.randn(k, 8, 1, 8, 8)
    torch._dynamo.reset()
    y = torch.randint(0, 10, (k, 8))
    run, own = RunInputs([p.detach() for p in net.parameters()]), ClientInputs()
    explained = torch._dynamo.explain(engine._train_fn(run, own, several=False, compiled=False))(params, [], x, y, run, own)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


@pytest.mark.slow
def test_compile_traces_a_cnn_as_one_graph():
    net = CNNSmall(num_classes=10, in_channels=1, image_size=28)
    engine = ParallelEngine()
    engine._prepare_model(net)
    engine._trainer = LocalSGD()
    params = [p.detach().unsqueeze(0).repeat(2, *[1] * p.dim()) for p in net.parameters()]
    x, y = torch.randn(2, 4, 1, 28, 28), torch.randint(0, 10, (2, 4))
    torch._dynamo.reset()
    run, own = RunInputs([p.detach() for p in net.parameters()]), ClientInputs()
    explained = torch._dynamo.explain(engine._train_fn(run, own, several=False, compiled=False))(params, [], x, y, run, own)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
