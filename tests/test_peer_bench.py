"""scripts/peer_bench.py compares like with like: its plain PyTorch loop trains the same round as fedagg's engines
(the same clients, batches and order, the same FedAvg), and without Flower it says what to install and still runs."""

import sys
from pathlib import Path

import pytest
import torch

from conftest import needs_mnist

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def scripts(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from peers import workload

    import peer_bench

    return workload, peer_bench


def tiny(workload, epochs=2):
    """8 clients of 25 random MNIST-shaped samples (a partial last batch), 3 a round, two local epochs."""
    from fedagg.data.datasets import DatasetBundle

    g = torch.Generator().manual_seed(1)
    bundle = DatasetBundle(name="mnist_random", num_classes=10, mean=(0.1307,), std=(0.3081,), augment=False,
                           train_x=torch.randint(0, 256, (200, 1, 28, 28), dtype=torch.uint8, generator=g),
                           train_y=torch.randint(0, 10, (200,), generator=g),
                           test_x=torch.zeros(1, 1, 28, 28, dtype=torch.uint8), test_y=torch.zeros(1, dtype=torch.long))
    w = workload.Workload(num_clients=8, per_round=3, samples_per_client=25, batch_size=10, local_epochs=epochs)
    return workload.Shared(bundle, w, rounds=2)


def test_plain_loop_and_engines_give_the_same_model(scripts):
    workload, _ = scripts
    from fedagg.engines.parallel import ParallelEngine
    from fedagg.engines.sequential import SequentialEngine

    shared = tiny(workload)
    start = shared.flat(shared.initial)
    rows = [workload.PlainLoop(shared), workload.FedaggEngine(shared, "sequential", SequentialEngine()),
            workload.FedaggEngine(shared, "parallel", ParallelEngine())]
    for r in (1, 2):
        for row in rows:
            row.round(r)
        plain, seq, par = (row.params() for row in rows)
        assert (seq - start).abs().max() > 1e-2  # the rounds moved the model, so agreement says something
        assert (plain - seq).abs().max() < 1e-6, r
        assert (par - seq).abs().max() < 1e-5, r
    assert [c.id for c in shared.chosen(1)] != [c.id for c in shared.chosen(2)]  # each round its own clients


def test_batches_follow_the_plan(scripts):
    """25 samples in batches of 10 over two epochs: 10, 10, 5 per epoch, each epoch a permutation of the client's."""
    workload, _ = scripts
    shared = tiny(workload)
    client = shared.chosen(1)[0]
    steps = workload.batches(shared.order(client, 1), batch_size=10, epochs=2)
    assert [len(b) for b in steps] == [10, 10, 5, 10, 10, 5]
    own = sorted(client.train_idx.tolist())
    assert sorted(torch.cat(steps[:3]).tolist()) == own and sorted(torch.cat(steps[3:]).tolist()) == own
    assert not torch.equal(torch.cat(steps[:3]), torch.cat(steps[3:]))  # each epoch draws its own order


def test_batch_order_matters_at_this_tolerance(scripts):
    """The agreement above is not loose: the same client on its batches in reverse order ends elsewhere."""
    workload, _ = scripts
    shared = tiny(workload, epochs=1)
    client = shared.chosen(1)[0]
    steps = workload.batches(shared.order(client, 1), batch_size=10, epochs=1)
    ends = []
    for order in (steps, steps[::-1]):
        model = shared.new_model()
        model.load_state_dict(shared.initial)
        workload.local_sgd(model, shared.x, shared.y, order, workload.LR)
        ends.append(shared.flat(model.state_dict()))
    assert (ends[0] - ends[1]).abs().max() > 1e-4


def test_without_flower_one_line_says_what_to_install(scripts, monkeypatch, capsys):
    _, peer_bench = scripts
    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr fails as it does where it is not installed
    monkeypatch.delitem(sys.modules, "peers.flower_app", raising=False)
    assert peer_bench.load_flower() is None
    assert capsys.readouterr().out == (
        "Flower's simulation is not installed (no module 'flwr'): pip install -e \".[peers]\" adds it; "
        "timing fedagg and the plain loop only\n")


@needs_mnist
def test_without_flower_the_other_rows_still_run(scripts, monkeypatch, capsys):
    _, peer_bench = scripts
    monkeypatch.setitem(sys.modules, "flwr", None)
    monkeypatch.delitem(sys.modules, "peers.flower_app", raising=False)
    threads = torch.get_num_threads()
    try:
        lines = peer_bench.main(["--clients", "20", "--per-round", "2", "--samples", "10", "--rounds", "1",
                                 "--data-root", str(ROOT.parent / "shared" / "data")])
    finally:
        torch.set_num_threads(threads)
    assert "pip install -e \".[peers]\" adds it" in capsys.readouterr().out
    assert [line.split()[0:2] for line in lines[1:]] == [["fedagg", "parallel"], ["fedagg", "sequential"],
                                                         ["plain", "PyTorch"]]
    assert float(lines[2].split()[-1]) == 0.0  # the sequential engine against itself
    assert float(lines[3].split()[-1]) < 1e-6  # the plain loop against it
