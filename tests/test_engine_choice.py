"""engine=auto and chunk_size=auto: which engine runs where, and how many clients a chunk holds."""

import pytest
import torch
from hydra.utils import instantiate

from conftest import compose_config
from fedagg.engines import auto, memory
from fedagg.engines.choice import RoundShape
from fedagg.engines.parallel import ParallelEngine
from fedagg.engines.sequential import SequentialEngine
from fedagg.models.cnns import CNNSmall
from fedagg.models.simple import MLP


def test_auto_gives_the_parallel_engine_its_options_and_the_sequential_one_its_batch(monkeypatch):
    """What engine=auto picks is fedagg.engines.choice's rule (tests/test_auto_engine.py); here, that the engine it
    hands the run is built from the engine group's options."""
    seq = RoundShape(per_round=2, kind="conv", params=1000, batch_size=8, device="cpu")  # too few clients to stack
    engine, picked = instantiate(compose_config("device=cpu", "engine.eval_batch_size=77").engine).for_run(seq)
    assert type(engine) is SequentialEngine and engine.eval_batch_size == 77 and picked.engine == "sequential"
    monkeypatch.setattr(auto, "resolve_device", lambda name: torch.device("cuda"))
    engine = instantiate(compose_config("engine.precision=bf16", "engine.chunk_size=7").engine)
    engine, picked = engine.for_run(RoundShape(**{**seq.__dict__, "device": "cuda"}))
    assert type(engine) is ParallelEngine and picked.engine == "parallel"
    assert (engine.precision, engine.chunk_size, engine.clients_in_memory) == ("bf16", 7, 7)


@pytest.mark.parametrize("key, value", [("precision", "bf16"), ("channels_last", True), ("compile", True)])
def test_auto_on_the_cpu_refuses_what_only_the_parallel_engine_does_where_it_picks_the_sequential_one(key, value):
    stacked = RoundShape(per_round=100, kind="conv", params=1000, batch_size=8, device="cpu")  # inside the bounds
    engine, _ = auto.auto_engine("cpu", **{key: value}).for_run(stacked)
    assert type(engine) is ParallelEngine and getattr(engine, key) == value
    alone = RoundShape(**{**stacked.__dict__, "kind": "recurrent"})
    with pytest.raises(ValueError, match=rf"^engine\.{key}=.*stacked recurrent models are not faster on the CPU\); "
                                         rf"use engine=parallel"):
        auto.auto_engine("cpu", **{key: value}).for_run(alone)


def test_auto_asks_for_cuda_only_where_there_is_one():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="device='cuda'"):
        auto.auto_engine("cuda")


@pytest.mark.parametrize("bad", [0, -3, "many", 2.5, True])
def test_chunk_size_is_auto_or_a_positive_integer(bad):
    with pytest.raises(ValueError, match=r"engine\.chunk_size=.*auto or an integer >= 1"):
        ParallelEngine(chunk_size=bad)


def test_activation_floats_counts_every_layers_output_for_one_sample():
    model = MLP(num_classes=10, in_channels=1, image_size=8, hidden=64)
    # Flatten 64, Linear 64, ReLU 64, Linear 10
    assert memory.activation_floats(model, torch.zeros(1, 8, 8)) == 64 + 64 + 64 + 10


def test_the_probe_changes_no_statistics_and_keeps_the_training_mode():
    torch.manual_seed(0)
    model = CNNSmall(num_classes=10, in_channels=3, image_size=32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    n = memory.activation_floats(model, torch.randn(3, 32, 32))
    assert n > 3 * 32 * 32 and model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_chunk_for_divides_the_devices_share_by_one_clients_cost():
    gib = 1 << 30
    # ResNet-18-sized: 11.2 M parameters, 2.5 M activation floats a sample, batches of 64, 20 clients
    per_client = 4 * (5 * 11_200_000 + 3 * 64 * 2_500_000)
    budget = 0.8 * 80 * gib - 2 * gib - 4 * 20 * 11_200_000
    assert memory.chunk_for(80 * gib, 2 * gib, 20, 11_200_000, 2_500_000, 64) == int(budget // per_client) == 30
    assert memory.chunk_for(80 * gib, 0, 10, 50_000, 200, 10) == memory.MAX_CHUNK  # tiny models: capped
    assert memory.chunk_for(gib, 2 * gib, 10, 50_000, 200, 10) == 1  # nothing left: one at a time


def test_auto_on_the_cpu_fits_small_models_in_few_calls_and_resolves_at_the_first_round():
    model = MLP(num_classes=10, in_channels=1, image_size=8)
    # 4,810 parameters; 64 + 64 + 64 + 10 floats out of Flatten, Linear, ReLU, Linear a sample: 4 * (5 * 4810 +
    # 3 * 32 * 202) = 173,768 bytes a client, 1,544 in 256 MiB: capped at 1,024
    assert memory.cpu_chunk(4810, 202, 32) == memory.MAX_CHUNK == 1024
    assert memory.auto_chunk_size(model, torch.zeros(1, 8, 8), 32, 500, 0) == 1024
    assert memory.cpu_chunk(4810, 202, 512) == 200  # batches of 512: 1,337,288 bytes a client
    assert memory.cpu_chunk(4810, 202, 2048) == 64  # 53 would fit: never fewer than CPU_CHUNK
    cnn = CNNSmall(num_classes=10, in_channels=1, image_size=28)  # activations fill caches: the floor of 64
    assert memory.auto_chunk_size(cnn, torch.zeros(1, 28, 28), 32, 500, 0) == memory.CPU_CHUNK == 64
    from test_parallel_engine import _setup
    from fedagg.clients.trainer import LocalSGD
    from fedagg.engines.base import RoundJob
    from fedagg.models.flat import get_buffers, get_params

    model, data, clients = _setup(MLP, 1, 8, [6, 5, 4], augment=False)
    engine = ParallelEngine()
    assert engine.chunk_size == "auto" and engine.clients_in_memory == 64
    engine.train_round(RoundJob(model, LocalSGD(lr=0.1, batch_size=4), data, clients, get_params(model),
                                get_buffers(model), lr=0.1, seed=0, round=1))
    assert engine.chunk_size == 1024  # an int from the first round on
