"""Round-wide temporaries cut to `block_rows` clients (fedagg.aggregators.blocks): same results, bounded memory."""

import dataclasses

import pytest
import torch

from memory import peak_bytes

from fedagg import RoundInputs
from fedagg.aggregators import ewwa
from fedagg.aggregators.base import FedAvg
from fedagg.aggregators.blocks import ALIGN, column_blocks, row_blocks, update_norms, weighted_update
from fedagg.aggregators.ewwa import EWWA
from fedagg.aggregators.fedams import FedCAMS
from fedagg.aggregators.fedexp import FedExP
from fedagg.aggregators.fednova import FedNova
from fedagg.aggregators.median import Median
from fedagg.aggregators.trimmed_mean import TrimmedMean
from fedagg.clients.trainer import LocalSGD, LocalSolver
from fedagg.engines.base import RoundJob
from fedagg.engines.sequential import SequentialEngine
from fedagg.loop.diagnostics import round_diagnostics
from fedagg.models.flat import get_buffers, get_params
from fedagg.models.simple import MLP
from test_parallel_engine import _setup  # a tiny federation of random images
from uploads import through_channel

K, P, B, ROWS = 12, 64 * 300 + 37, 70, 2  # P not a multiple of ALIGN: the last block is short
FLOAT = 4  # bytes


def _inputs(block_rows, seed=0, **extra):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(P, generator=g)
    clients = w + 0.1 * torch.randn(K, P, generator=g)
    return RoundInputs.of(w, clients, num_samples=torch.randint(5, 50, (K,), generator=g),
                          client_ids=torch.randperm(K, generator=g) + 3, block_rows=block_rows, **extra)


def _buffers(seed=1):
    g = torch.Generator().manual_seed(seed)
    gb = torch.rand(B, generator=g)
    return {"global_buffers": gb, "client_buffers": gb + 0.05 * torch.rand(K, B, generator=g)}


def test_column_blocks_cover_every_column_once_aligned_and_within_the_bound():
    blocks = column_blocks(K, P, ROWS)
    assert blocks[0].start == 0 and blocks[-1].stop == P
    assert all(a.stop == b.start for a, b in zip(blocks, blocks[1:]))
    width = blocks[0].stop
    assert width % ALIGN == 0
    assert K * width <= ROWS * P and K * (width + ALIGN) > ROWS * P  # widest aligned
    assert len(blocks) == P // width and ALIGN <= blocks[-1].stop - blocks[-1].start < width + ALIGN  # short tail joined
    assert column_blocks(K, P, K) == [slice(0, P)] == column_blocks(K, P, None)  # a round that fits: one block
    assert column_blocks(K, 10, 1) == [slice(0, 10)]  # never narrower than ALIGN
    assert row_blocks(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)] and row_blocks(5, 5) == [slice(0, 5)]


# Blocked and whole results are compared to rounding, not bit for bit: each call hands BLAS a matrix of
# another width, and how a kernel (and its threads) splits the columns is its own affair. A block that
# is skipped, shifted or counted twice is off by ~0.1 (updates are 0.1 * N(0, 1)), far above 1e-6.
BLOCKED = dict(rtol=1e-5, atol=1e-6)


def test_blocked_helpers_equal_the_whole_computation_to_rounding():
    x = _inputs(None)
    weights = torch.rand(K)
    whole = weights @ (x.client_params - x.global_params)
    norms = torch.linalg.vector_norm(x.client_params - x.global_params, dim=1)
    for rows in (1, ROWS, 5):
        blocked = dataclasses.replace(x, block_rows=rows)
        torch.testing.assert_close(weighted_update(weights, blocked), whole, **BLOCKED)
        torch.testing.assert_close(update_norms(blocked), norms, **BLOCKED)


def _fednova():
    agg = FedNova()
    steps = torch.randint(3, 9, (K,), generator=torch.Generator().manual_seed(2))
    solver = LocalSolver(momentum=0.0, nesterov=False, weight_decay=0.0, proximal_mu=0.0, keeps_momentum=False)
    return agg, {"local_steps": steps, "local_lr": 0.1, "local_solver": solver}


EXACT = {  # name: (aggregator, extra inputs); per-parameter rules come out the same up to rounding
    "fedavg": lambda: (FedAvg(), {}),
    "fednova": _fednova,
    "fedexp": lambda: (FedExP(), {}),
    "ewwa": lambda: (EWWA(), {}),
    "ewwa_per_client_softmax": lambda: (EWWA(moments="per_client", weighting="softmax"), {}),
    "ewwa_elementwise": lambda: (EWWA(buffers="elementwise"), _buffers()),
    "median": lambda: (Median(), {}),
    "median_buckets": lambda: (Median(bucket_size=5), {}),  # 3 buckets of 5, 5 and 2: an odd count
    "trimmed_mean": lambda: (TrimmedMean(beta=0.2), {}),
}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_aggregators_give_the_same_model_in_blocks(name):
    outs = []
    for rows in (None, ROWS):
        agg, extra = EXACT[name]()
        results = [agg.aggregate(_inputs(rows, seed=r, **extra)) for r in (0, 1)]  # two rounds: state carried in blocks
        res = results[-1]
        outs.append(([r.params for r in results], res.weights, res.weights_for_buffers(), res.metrics))
    (new0, w0, bw0, d0), (new1, w1, bw1, d1) = outs
    for a, b in zip(new0, new1):
        torch.testing.assert_close(b, a, **BLOCKED)
    assert torch.allclose(w0, w1, rtol=1e-6, atol=0)  # mean weights sum over P in pieces: rounding only
    torch.testing.assert_close(bw1, bw0, **BLOCKED)
    assert d0.keys() == d1.keys() and all(d0[k] == pytest.approx(d1[k], rel=1e-6) for k in d0)


@pytest.mark.parametrize("rows", [None, ROWS])
def test_ewwa_elementwise_on_a_model_without_buffers_weights_parameters_as_samples_does(rows):
    empty = {"global_buffers": torch.zeros(0), "client_buffers": torch.zeros(K, 0)}
    x = _inputs(rows, **empty)
    elementwise, samples = EWWA(buffers="elementwise"), EWWA()
    elementwise_res, samples_res = elementwise.aggregate(x), samples.aggregate(x)
    assert torch.equal(elementwise_res.params, samples_res.params)
    assert torch.equal(elementwise_res.weights, samples_res.weights)
    assert elementwise_res.weights_for_buffers().shape == (K, 0)


def test_ewwa_log_shift_takes_one_minimum_across_blocks():
    """The shift is the minimum over every block: blocks weighted with their own minimum would differ."""
    x = _inputs(None)
    x.client_params[3, -5] -= 40.0  # the round's most negative step sits in the last block only
    whole, blocked = EWWA(), EWWA()
    whole_res = whole.aggregate(x)
    new = whole_res.params
    assert len(column_blocks(K, P, ROWS)) > 1
    blocked_res = blocked.aggregate(dataclasses.replace(x, block_rows=ROWS))
    got = blocked_res.params
    torch.testing.assert_close(got, new, **BLOCKED)


def test_fedcams_in_blocks_matches_to_rounding_and_keeps_errors_per_id():
    outs = []
    for rows in (None, ROWS):
        agg = FedCAMS(compressor="topk", ratio=0.1)
        results = [through_channel(agg, _inputs(rows, seed=r)) for r in (0, 1)]
        outs.append(([r.params for r in results], agg.feedback.memory.rows, results[-1].metrics))
    (new0, e0, d0), (new1, e1, d1) = outs
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(new0, new1))
    assert e0.keys() == e1.keys() and all(torch.equal(e0[i], e1[i]) for i in e0)  # per row: exact
    assert d0["error_norm"] == pytest.approx(d1["error_norm"], rel=1e-6)


# what each rule adds on top of its inputs, in clients' worth of parameters (P floats), with blocks of
# one client's worth: its outputs and state ([P] vectors) and a few one-client temporaries; the whole
# round (K = 12) takes that many times K. FedCAMS compresses in the upload channel, in row blocks of its own
# (tests/test_channel_row_blocks.py): its aggregation is FedAMS's.
BOUNDS = {"fedavg": (4, 12), "fednova": (4, 12), "fedexp": (4, 12), "ewwa": (13, 60),
          "ewwa_per_client_softmax": (17, 60), "ewwa_elementwise": (13, 60), "median": (6, 36),
          "trimmed_mean": (6, 36)}


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_peak_memory_of_an_aggregation_follows_block_rows(name, monkeypatch):
    monkeypatch.setattr(ewwa, "QUANTILE_SAMPLE", 1024)  # the quantiles' fixed-size sample aside
    make = EXACT[name]
    peaks = []
    for rows in (1, None):
        agg, extra = make()
        x = _inputs(rows, **extra)
        peaks.append(peak_bytes(agg.aggregate, x)[0] / (P * FLOAT))
    blocked, whole = peaks
    bound, unbounded = BOUNDS[name]
    assert blocked <= bound < unbounded <= whole, peaks


def test_diagnostics_norms_in_row_blocks():
    x = _inputs(None)
    weights = torch.full((K,), 1 / K)
    new = x.global_params + 0.01
    whole = round_diagnostics(x, new, weights)
    peak, blocked = peak_bytes(round_diagnostics, dataclasses.replace(x, block_rows=ROWS), new, weights)
    assert blocked == whole
    assert peak <= (ROWS + 1) * P * FLOAT


def test_sequential_engine_holds_the_rounds_models_once():
    """Rows filled in place: no list of K vectors stacked into a second [K, P] at the end."""
    model, data, clients = _setup(lambda **kw: MLP(hidden=256, **kw), 1, 28, [8] * K, augment=False)
    job = RoundJob(model, LocalSGD(lr=0.1, batch_size=8), data, clients, get_params(model), get_buffers(model),
                   lr=0.1, seed=0, round=1)
    peak, result = peak_bytes(SequentialEngine().train_round, job)
    p = result.params.shape[1]
    assert result.params.shape == (K, p) and p > 200_000
    assert peak < 1.5 * K * p * FLOAT, peak / (p * FLOAT)  # one [K, P] and one client's training, not two [K, P]
