"""Samplers on the asynchronous server (server=async): each dispatch of n idle clients is one step of the run's
sampler, numbered by its first dispatch n and drawn from the stream (seed, "dispatch", n). Uniform is the draw the
server always made; size draws ∝ n_k among the idle clients (an event-by-event replay on a constant clock);
Power-of-Choice sends the highest-loss candidates under the current model (by hand); a stopped and resumed run is
the uninterrupted one."""

import csv
import heapq

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import chisquare

from conftest import compose_config
from fedagg.loop.asynchronous import AsyncServer
from fedagg.models.flat import set_params
from fedagg.run import prepare, train
from fedagg.runtime.interrupts import StopRequests
from fedagg.runtime.progress import RoundProgress
from fedagg.sampling.base import Draw, Sampler
from fedagg.sampling.size import SizeProportional
from fedagg.seeding import generator
from test_async_resume import RUN, assert_same_files, stop_after_step

EQUAL_CLOCK = ["clock=uniform", "clock.min=1.0", "clock.mean=1.0"]  # 1 s a step for every client: integer times


def clients_in(path):
    with open(path) as f:
        return [int(r["client"]) for r in csv.DictReader(f)]


def old_choose_idle(k, idle, seed, dispatch):
    """The asynchronous server's dispatch draw before it took a sampler (fedagg/loop/asynchronous.py at 8844c78)."""
    if k >= len(idle):
        return list(idle)
    order = torch.randperm(len(idle), generator=generator(seed, "dispatch", dispatch))[:k]
    return sorted(idle[i] for i in order.tolist())


def test_uniform_on_the_dispatch_stream_is_the_old_dispatch_draw():
    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.integers(1, 25))
        idle = sorted(rng.choice(40, n, replace=False).tolist())
        k, seed, dispatch = int(rng.integers(1, 6)), int(rng.integers(0, 5)), int(rng.integers(0, 500))
        draw = Draw(seed, torch.ones(40, dtype=torch.long), stream="dispatch", first=0)
        assert Sampler().choose(k, torch.tensor(idle), dispatch, draw) == old_choose_idle(k, idle, seed, dispatch)


def test_the_dispatch_stream_is_not_the_rounds_stream():
    sizes, pool = torch.arange(1, 21), torch.arange(20)
    rounds, dispatches = Draw(0, sizes), Draw(0, sizes, stream="dispatch", first=0)
    for sampler in (Sampler(), SizeProportional()):
        differ = [sampler.choose(3, pool, s, rounds) != sampler.choose(3, pool, s, dispatches) for s in range(1, 21)]
        assert sum(differ) >= 15  # independent draws of 3 of 20 agree rarely


def test_size_on_the_dispatch_stream_sends_clients_in_proportion_to_their_data():
    sizes = torch.tensor([10, 20, 30, 40, 0, 100])  # client 4 holds nothing: never sent
    draw, pool, trials = Draw(3, sizes, stream="dispatch", first=0), torch.arange(6), 4000
    counts = np.zeros(6)
    for n in range(trials):
        counts[SizeProportional().choose(1, pool, n, draw)] += 1
    assert counts[4] == 0
    keep = [0, 1, 2, 3, 5]
    assert chisquare(counts[keep], sizes[keep].numpy() / 200 * trials).pvalue > 1e-3
    # the same counts are far from uniform's 1/5 each: the check tells the rules apart
    assert chisquare(counts[keep], np.full(5, trials / 5)).pvalue < 1e-12


def replay(seed, sizes, steps, concurrency, arrivals):
    """The asynchronous server with FedAsync (a server step per arrival) on a constant clock of 1 s a step, event by
    event: the clients of the first `arrivals` arrivals, in order. Arrivals at an instant all come before anyone is
    sent; ties go to the earlier dispatch; the owed clients are drawn together, ∝ n_k among the idle ones, from
    the stream of the first dispatch they start."""
    now, owed, dispatches, queue, flying, order = 0.0, concurrency, 0, [], {}, []
    while len(order) < arrivals:
        if queue and queue[0][0] <= now:
            order.append(flying.pop(heapq.heappop(queue)[1]))
            owed += 1
        elif owed:
            idle = torch.tensor([i for i in range(len(sizes)) if i not in flying.values()])
            picks = torch.multinomial(sizes[idle].double(), owed, replacement=False,
                                      generator=generator(seed, "dispatch", dispatches))
            for i in sorted(idle[picks].tolist()):
                flying[dispatches] = i
                heapq.heappush(queue, (now + steps[i], dispatches))
                dispatches += 1
            owed = 0
        else:
            now = queue[0][0]
    return order


def test_size_sampler_on_a_constant_clock_sends_what_a_replay_of_the_events_sends(tmp_path):
    """Dirichlet sizes (unequal), 3 clients in flight, integer arrival times (many ties, so several clients are
    owed at once): the clients of the 12 server steps are the replay's, and not the uniform draw's."""
    common = ["device=cpu", "rounds=12", "num_clients=8", "seed=1", "aggregator=fedasync", "server=async",
              "server.concurrency=3", *EQUAL_CLOCK]
    train(compose_config(*common, "sampler=size"), tmp_path / "size")
    train(compose_config(*common), tmp_path / "uniform")
    with prepare(compose_config(*common, "sampler=size"), tmp_path / "fresh") as run:
        fed = run.loop.fed
        sizes = torch.tensor([c.num_samples for c in fed.clients])
        steps = [fed.trainer.steps(c) for c in fed.clients]
    assert len(set(sizes.tolist())) == 8 and len(set(steps)) > 1  # the premise: unequal sizes and times
    expected = replay(1, sizes, steps, 3, 12)
    assert clients_in(tmp_path / "size" / "weights.csv") == expected
    assert clients_in(tmp_path / "uniform" / "weights.csv") != expected


def next_is_a_dispatch(server):
    return not (server.queue and server.queue[0][0] <= server.now) and server.owed and not server.waiting


def losses_by_hand(fed, params, ids):
    """Mean cross-entropy of the model `params` on each client's whole training split, in eval mode."""
    set_params(fed.model, params)
    fed.model.eval()
    with torch.no_grad():
        return torch.tensor([float(F.cross_entropy(fed.model(fed.data.prepare(fed.data.train_images(idx))),
                                                   fed.data.train_y[idx]))
                             for idx in (fed.clients[i].train_idx for i in ids)])


def test_power_of_choice_sends_the_candidates_with_the_largest_loss_of_the_current_model(tmp_path):
    """8 clients, 2 in flight, d = 4: the first dispatch is uniform's (nothing scored); each later one draws 4
    candidates ∝ n_k among the idle clients and sends the highest-loss one under the model it will be sent,
    computed here by hand on their whole training splits."""
    cfg = compose_config("device=cpu", "rounds=4", "num_clients=8", "seed=2", "aggregator=fedasync",
                         "server=async", "server.concurrency=2", "clock=lognormal", "sampler=power_of_choice",
                         "sampler.d=4")
    with prepare(cfg, tmp_path) as run, StopRequests() as stop:
        loop, fed = run.loop, run.loop.fed
        loop.start(stop, RoundProgress(1, 4, bar=False))
        initial = loop.params.clone()
        sizes = torch.tensor([c.num_samples for c in fed.clients])
        server = AsyncServer(loop, 2)
        loop.schedule = server
        server.step()
        assert sorted(f.client for f in server.flights.values()) == old_choose_idle(2, list(range(8)), 2, 0)
        checked, stale_choice = 0, 0
        while loop.running:
            if not next_is_a_dispatch(server):
                server.step()
                continue
            busy = {f.client for f in server.flights.values()}
            idle = torch.tensor([i for i in range(8) if i not in busy])
            first = server.dispatches
            candidates = idle[torch.multinomial(sizes[idle].double(), 4, replacement=False,
                                                generator=generator(2, "dispatch", first))].tolist()
            now = losses_by_hand(fed, loop.params, candidates)
            expected = sorted(candidates[i] for i in now.argsort(descending=True)[:server.owed].tolist())
            then = losses_by_hand(fed, initial, candidates)
            stale_choice += expected != sorted(candidates[i] for i in then.argsort(descending=True)[:server.owed])
            server.step()
            assert sorted(f.client for d, f in server.flights.items() if d >= first) == expected
            checked += 1
        assert loop.complete()["status"] == "completed"
    assert checked >= 3 and stale_choice >= 1  # the initial model would have sent another client at least once


POC = [*RUN, "sampler=power_of_choice", "sampler.samples=20"]  # cpow-d: 20 random samples of each candidate


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reference")
    assert train(compose_config(*POC, "rounds=8"), folder)["status"] == "completed"
    return folder


@pytest.mark.parametrize("stop_at", [3, 4])  # after a step, and after a checkpoint_every step
def test_power_of_choice_stopped_and_resumed_gives_the_uninterrupted_files(stop_at, reference, tmp_path):
    stop_after_step(POC, stop_at, tmp_path)
    assert train(compose_config(*POC, "rounds=8", "resume=true"), tmp_path)["status"] == "completed"
    assert_same_files(tmp_path, reference)


def test_power_of_choice_sends_other_clients_than_uniform(reference, tmp_path):
    train(compose_config(*RUN, "rounds=8"), tmp_path)  # the same run with the uniform sampler
    assert clients_in(reference / "weights.csv") != clients_in(tmp_path / "weights.csv")
