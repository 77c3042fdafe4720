"""engine=auto picks an engine from the run's configuration: the rule at each side of its bounds, the model kinds it
reads, the start-up line and summary.json that say the pick, a resume that keeps the recorded pick (also a folder
written before the rule), and the parallel engine's own options refused in one line where the sequential one runs.

The runs are the default digits run (10 clients of 4,810-parameter MLPs, batch 32), cut to few rounds."""

import json
import logging

import pytest
import torch

from fedagg.engines import choice
from fedagg.engines.auto import PICKED, REASON
from fedagg.engines.choice import RoundShape, choose, model_kind
from fedagg.models.cnns import CNNSmall
from fedagg.models.leaf import LSTMShakespeare
from fedagg.models.resnet_cifar import ResNet20
from fedagg.models.simple import MLP, MLR
from fedagg.models.vit import ViT
from fedagg.run import SetupError, run_experiment
import test_drivers
from test_stacked_auto import stopped_after_round_1

RUN = ["device=cpu", "rounds=3", "checkpoint_every=1"]
# shapes at every bound of the CPU rule for their kind
CONV = RoundShape(per_round=10, kind="conv", params=100_000, batch_size=10, device="cpu")
LINEAR = RoundShape(per_round=5, kind="linear", params=100_000, batch_size=32, device="cpu")


def _with(shape, **change):
    return RoundShape(**{**shape.__dict__, **change})


@pytest.mark.parametrize("shape, engine", [
    (CONV, "parallel"),
    (_with(CONV, per_round=9), "sequential"),
    (_with(CONV, batch_size=11), "sequential"),
    (_with(CONV, params=100_001), "sequential"),
    (LINEAR, "parallel"),
    (_with(LINEAR, per_round=4), "sequential"),
    (_with(LINEAR, batch_size=33), "sequential"),
    (_with(LINEAR, params=100_001), "sequential"),
    (_with(LINEAR, kind="recurrent", batch_size=1, per_round=1000, params=1000), "sequential"),
    (_with(LINEAR, kind="transformer", batch_size=1, per_round=1000, params=1000), "sequential"),
    # the grid's workloads
    (RoundShape(100, "conv", 21_840, 10, "cpu"), "parallel"),  # cross_device, cnn_small
    (RoundShape(10, "conv", 15_826, 64, "cpu"), "sequential"),  # cross_silo, LeNet
    (RoundShape(100, "conv", 269_722, 10, "cpu"), "sequential"),  # ResNet-20
    (RoundShape(10, "linear", 4810, 32, "cpu"), "parallel"),  # the default digits run's MLP
    (RoundShape(100, "linear", 7850, 10, "cpu"), "parallel"),  # MNIST MLR
    (RoundShape(10, "recurrent", 819_920, 10, "cpu"), "sequential"),  # the Shakespeare LSTM
])
def test_the_cpu_rule_at_each_side_of_its_bounds(shape, engine):
    picked, reason = choose(shape)
    assert picked == engine
    assert reason.startswith(shape.words())


@pytest.mark.parametrize("shape", [CONV, RoundShape(1, "recurrent", 50_000_000, 512, "cpu")])
def test_a_gpu_always_gets_the_parallel_engine(shape):
    assert choose(RoundShape(**{**shape.__dict__, "device": "cuda"}))[0] == "parallel"


def test_the_words_name_clients_model_and_device():
    assert CONV.words() == "10 clients a round of a 0.1M-param conv model, batch 10, on the CPU"
    assert RoundShape(1, "linear", 4810, 8, "cuda").words() == "1 client a round of a 4.8k-param linear model, batch 8, on a GPU"


@pytest.mark.parametrize("model, kind", [
    (MLP(num_classes=10, in_channels=1, image_size=8), "linear"),
    (MLR(num_classes=10, in_channels=1, image_size=28), "linear"),
    (CNNSmall(num_classes=10, in_channels=1, image_size=28), "conv"),
    (ResNet20(num_classes=10, in_channels=3, image_size=32), "conv"),
    (LSTMShakespeare(num_classes=80, in_channels=1, image_size=80), "recurrent"),
    (ViT(num_classes=10, in_channels=3, image_size=32), "transformer"),  # its patch embedding is a convolution
    (torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.GRU(4, 4)), "recurrent"),
    (torch.nn.Sequential(torch.nn.MultiheadAttention(4, 2)), "transformer"),
])
def test_model_kinds(model, kind):
    assert model_kind(model) == kind


def _picked_line(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("engine: ")]


def test_the_start_up_line_and_the_summary_say_the_pick_and_why(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="fedagg")
    summary = run_experiment(["device=cpu", "rounds=1"], tmp_path / "ten")
    why = "10 clients a round of a 4.8k-param linear model, batch 32, on the CPU"
    assert _picked_line(caplog) == [f"engine: parallel (auto: {why})"]
    assert (summary[PICKED], summary[REASON]) == ("parallel", why)
    assert json.loads((tmp_path / "ten" / "summary.json").read_text())[PICKED] == "parallel"
    caplog.clear()
    summary = run_experiment(["device=cpu", "rounds=1", "clients_per_round=4"], tmp_path / "four")
    why = "4 clients a round of a 4.8k-param linear model, batch 32, on the CPU: fewer than 5 clients a round to stack"
    assert _picked_line(caplog) == [f"engine: sequential (auto: {why})"]
    assert (summary[PICKED], summary[REASON]) == ("sequential", why)


def test_an_explicit_engine_records_no_pick(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="fedagg")
    summary = run_experiment(["device=cpu", "rounds=1", "engine=sequential"], tmp_path / "run")
    assert PICKED not in summary and _picked_line(caplog) == []


def assert_same_run(a, b, *also_variable):
    """Files equal to 1e-6 relative (test_drivers.py), the summaries but wall times, the overrides as typed and
    `also_variable`."""
    saved = set(test_drivers.VARIABLE)
    test_drivers.VARIABLE |= {"overrides", *also_variable}
    try:
        test_drivers.assert_same_run(a, b)
    finally:
        test_drivers.VARIABLE.clear()
        test_drivers.VARIABLE.update(saved)


def test_a_resume_keeps_the_recorded_pick_when_the_rule_now_picks_otherwise(tmp_path, monkeypatch, caplog):
    run_experiment([*RUN, "resume=true"], tmp_path / "reference")  # parallel throughout, its config as resumed
    stopped_after_round_1(RUN, tmp_path / "job")
    monkeypatch.setitem(choice.CPU_PARALLEL["linear"], "min_clients", 11)  # the rule now says sequential for 10 clients
    caplog.set_level(logging.INFO, logger="fedagg")
    resumed = run_experiment([*RUN, "resume=true"], tmp_path / "job")
    why = "10 clients a round of a 4.8k-param linear model, batch 32, on the CPU"  # as recorded at the start
    assert _picked_line(caplog) == [f"engine: parallel (auto: {why})"]
    assert (resumed["status"], resumed[PICKED], resumed[REASON]) == ("completed", "parallel", why)
    assert_same_run(tmp_path / "job", tmp_path / "reference")
    fresh = run_experiment(RUN, tmp_path / "fresh")  # a new run follows the rule
    assert fresh[PICKED] == "sequential"


def test_a_folder_written_before_the_rule_resumes_with_the_sequential_engine_on_the_cpu(tmp_path, monkeypatch, caplog):
    """Such a run trained with the sequential engine on the CPU (engine=auto's choice then) and recorded no pick."""
    monkeypatch.setitem(choice.CPU_PARALLEL["linear"], "min_clients", 11)  # what the rule before picked: sequential
    run_experiment([*RUN, "resume=true"], tmp_path / "reference")
    stopped_after_round_1(RUN, tmp_path / "job")
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        if (path := tmp_path / "job" / name).exists():
            state = torch.load(path, weights_only=False)
            del state["summary"][PICKED], state["summary"][REASON]
            torch.save(state, path)
    monkeypatch.undo()  # the rule now picks the parallel engine for 10 clients
    caplog.set_level(logging.INFO, logger="fedagg")
    resumed = run_experiment([*RUN, "resume=true"], tmp_path / "job")
    assert _picked_line(caplog) == ["engine: sequential (auto: on the CPU, as engine=auto picked when this run started)"]
    assert (resumed["status"], resumed[PICKED]) == ("completed", "sequential")
    assert_same_run(tmp_path / "job", tmp_path / "reference", REASON)


@pytest.mark.parametrize("key, value", [("precision", "bf16"), ("channels_last", "true"), ("compile", "true")])
def test_a_parallel_engine_option_where_auto_picks_sequential_is_one_line(tmp_path, key, value):
    with pytest.raises(SetupError) as err:
        run_experiment(["device=cpu", "rounds=1", "clients_per_round=4", f"engine.{key}={value}"], tmp_path / "run")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"engine.{key}=") and "needs the parallel engine, which engine=auto does not pick" in message
    assert "fewer than 5 clients a round" in message and "use engine=parallel" in message
    assert not (tmp_path / "run" / "metrics.csv").exists()


def test_a_parallel_engine_option_where_auto_picks_parallel_is_used(tmp_path):
    summary = run_experiment(["device=cpu", "rounds=1", "engine.precision=bf16"], tmp_path / "run")
    assert (summary["status"], summary[PICKED]) == ("completed", "parallel")
