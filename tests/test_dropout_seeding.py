"""A model that draws in training (cnn_emnist_tff's dropout) takes its draws from the run's seed: each engine seeds
torch's global generator for local training (fedagg.seeding.global_rng), so two runs of one seed are equal
whatever the process drew before them, another seed draws other masks, and a stopped run resumes bit for bit."""

import csv

import pytest
import torch

from conftest import compose_config
from fedagg.clients.trainer import LocalSGD
from fedagg.engines.base import RoundJob
from fedagg.engines.parallel import ParallelEngine
from fedagg.engines.sequential import SequentialEngine
from fedagg.models.flat import get_buffers, get_params
from fedagg.models.tff import CNNEmnistTFF
from fedagg.run import train
from stopping import stopped_in_round_2
from test_parallel_engine import _setup


@pytest.mark.parametrize("engine", [SequentialEngine, ParallelEngine], ids=["sequential", "parallel"])
def test_dropout_masks_follow_the_seed_and_not_what_the_process_drew_before(engine):
    model, data, clients = _setup(CNNEmnistTFF, 1, 28, [6, 9], False)
    start = get_params(model), get_buffers(model)

    def two_rounds(seed):
        trainer = LocalSGD(lr=0.05, momentum=0.0, batch_size=4, local_epochs=1)
        before = torch.get_rng_state()
        out = torch.stack([engine().train_round(RoundJob(model, trainer, data, clients, start[0].clone(),
                                                         start[1].clone(), lr=0.05, seed=seed, round=r)).params
                           for r in (1, 2)])
        assert torch.equal(torch.get_rng_state(), before)  # training leaves the global generator as it was
        return out

    torch.manual_seed(1)
    first = two_rounds(3)
    torch.rand(1000)  # the process drew elsewhere (another run of a sweep, a user's code)
    assert torch.equal(two_rounds(3), first)
    assert not torch.equal(two_rounds(4), first)


def _rows(path):
    with open(path) as f:
        return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in csv.DictReader(f)]


@pytest.mark.parametrize("engine", ["sequential", "parallel"])
def test_runs_of_a_dropout_model_repeat_and_resume_bit_for_bit(tmp_path, engine):
    overrides = ["model=cnn_emnist_tff", "rounds=3", "device=cpu", "checkpoint_every=1", f"engine={engine}",
                 "aggregator._target_=stopping.StopInRound2"]
    reference = train(compose_config(*overrides), tmp_path / "reference")
    torch.rand(1000)
    again = train(compose_config(*overrides), tmp_path / "again")
    run = tmp_path / "run"
    stopped = stopped_in_round_2(train, compose_config(*overrides), run)
    assert stopped["status"] == "interrupted" and stopped["rounds_completed"] == 2
    torch.rand(1000)
    resumed = train(compose_config(*overrides, "resume=true"), run)
    assert reference["status"] == again["status"] == resumed["status"] == "completed"
    ref = torch.load(tmp_path / "reference" / "model.pt")
    for folder in ("again", "run"):
        got = torch.load(tmp_path / folder / "model.pt")
        assert all(torch.equal(got[k], ref[k]) for k in ref), folder
        assert _rows(tmp_path / folder / "metrics.csv") == _rows(tmp_path / "reference" / "metrics.csv"), folder
        assert (tmp_path / folder / "weights.csv").read_bytes() == (tmp_path / "reference" / "weights.csv").read_bytes()
