"""EWWA-FL against a plain-numpy reading of SPEC "EWWA-FL", plus the aggregator invariants."""

import itertools
import math

import numpy as np
import pytest
import torch

from fedagg import RoundInputs
from fedagg.aggregators import ewwa
from fedagg.aggregators.ewwa import EWWA
from fedagg.loop.round_loop import combine_buffers

OPTIMIZERS = ("adam", "adagrad", "yogi")
MOMENTS = ("shared_sequential", "per_client")
WEIGHTINGS = ("log_shift", "softmax")
ALL = list(itertools.product(OPTIMIZERS, MOMENTS, WEIGHTINGS))
SAMPLES = torch.tensor([10, 30, 20])


def reference(rounds, optimizer, moments, weighting, lr=1.0, b1=0.9, b2=0.999, eps=1e-8):
    """SPEC's text in float64: rounds = [(w [P], W [K,P], ids [K])]; per round (new, mean p [K], m, v)."""
    m = v = np.zeros(len(rounds[0][0]))
    out = []

    def second(v, g):
        if optimizer == "adam":
            return b2 * v + (1 - b2) * g**2
        if optimizer == "adagrad":
            return v + g**2
        return v - (1 - b2) * g**2 * np.sign(v - g**2)

    for r, (w, W, ids) in enumerate(rounds, start=1):
        g = w[None, :] - W
        s = lr * math.sqrt(1 - b2**r) / (1 - b1**r)
        b = np.zeros_like(g)
        if moments == "shared_sequential":
            for k in np.argsort(ids):  # ascending id, whatever position the client has
                m = b1 * m + (1 - b1) * g[k]
                v = second(v, g[k])
                b[k] = s * m / (np.sqrt(v) + eps)
        else:
            mk, vk = b1 * m + (1 - b1) * g, second(v[None, :], g)
            b = s * mk / (np.sqrt(vk) + eps)
            m, v = mk.mean(axis=0), vk.mean(axis=0)
        if weighting == "log_shift":
            q = np.log(b - b.min() + 1) + 1e-8
            p = q / q.sum(axis=0)
        else:
            e = np.exp(b - b.max(axis=0))
            p = e / e.sum(axis=0)
        assert np.allclose(p.sum(axis=0), 1.0)
        out.append((w - (p * g).sum(axis=0), p.mean(axis=1), m.copy(), v.copy()))
    return out


def make_rounds(ids_per_round, P=5, seed=0, dtype=np.float64):
    """Start w [P] and each round's client updates [K, P]."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=P).astype(dtype)
    return w, [rng.normal(scale=0.1, size=(len(ids), P)).astype(dtype) for ids in ids_per_round]


def run_both(config, ids_per_round, seed=0, dtype=np.float64):
    """The implementation round by round (its output feeds the next round), and the reference on the same inputs."""
    w, deltas = make_rounds(ids_per_round, seed=seed, dtype=dtype)
    agg, rounds, got = EWWA(*config), [], []
    for ids, delta in zip(ids_per_round, deltas):
        W = w[None, :] + delta
        rounds.append((w.astype(np.float64), W.astype(np.float64), np.array(ids)))
        res = agg.aggregate(RoundInputs.of(torch.from_numpy(w), torch.from_numpy(W), num_samples=SAMPLES[: len(ids)], client_ids=torch.tensor(ids), round=len(rounds)))
        new = res.params
        got.append((new, res.weights.clone(), agg.m.clone(), agg.v.clone()))
        w = new.numpy()
    return got, reference(rounds, *config), rounds


# unsorted ids; partial participation (new client 5, K changes: the moments are shared, not per id);
# float32 with a loose tolerance: in round 1 b_k = sign(g_k) up to eps-sized terms, so log_shift's weights
# among clients at the minimum hinge on differences float32 resolves only to a few percent
SCHEDULES = {"unsorted": ([[2, 0, 1], [1, 2, 0]], 0, np.float64, 1e-9),
             "partial": ([[0, 1, 2], [5, 2]], 1, np.float64, 1e-9),
             "float32": ([[2, 0, 1], [1, 2, 0]], 0, np.float32, 1e-3)}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("config", ALL, ids=["-".join(c) for c in ALL])
def test_two_rounds_match_numpy_reference(config, schedule):
    ids, seed, dtype, tol = SCHEDULES[schedule]
    got, want, _ = run_both(config, ids, seed, dtype)
    for (new, weights, m, v), (w_new, w_weights, w_m, w_v) in zip(got, want):
        assert new.dtype == weights.dtype == m.dtype == v.dtype == torch.from_numpy(np.zeros(1, dtype)).dtype
        for t, a in ((new, w_new), (weights, w_weights), (m, w_m), (v, w_v)):
            assert np.allclose(t.double().numpy(), a, rtol=tol, atol=tol)
        assert torch.all(weights >= 0) and abs(float(weights.sum()) - 1) < 1e-6


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_sequential_order_is_by_id_not_by_position(optimizer):
    config = (optimizer, "shared_sequential", "log_shift")
    ids = [2, 0, 1]
    got, want, rounds = run_both(config, [ids])
    # the same clients listed in ascending order give the same result, weights follow the clients
    w, W, _ = rounds[0]
    order = np.argsort(ids)
    agg = EWWA(*config)
    res = agg.aggregate(RoundInputs.of(torch.tensor(w), torch.tensor(W[order]), num_samples=SAMPLES, client_ids=torch.tensor(sorted(ids)), round=1))
    new = res.params
    assert torch.equal(new, got[0][0])
    assert torch.equal(res.weights, got[0][1][torch.from_numpy(order)])
    # processing in position order would be a different answer, so the test above can fail
    positional = reference([(w, W, np.arange(3))], *config)
    assert not np.allclose(positional[0][0], want[0][0], rtol=1e-4, atol=1e-4)


def test_step_count_is_the_aggregators_not_the_round_argument():
    w, W = torch.zeros(4), torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.5, 1.0, -1.0, 2.0], [2.0, 0.0, 1.0, -1.0]])
    a, b = EWWA(), EWWA()
    ids = torch.tensor([0, 1, 2])
    assert torch.equal(a.aggregate(RoundInputs.of(w, W, num_samples=SAMPLES, client_ids=ids, round=1)).params, b.aggregate(RoundInputs.of(w, W, num_samples=SAMPLES, client_ids=ids, round=9)).params)
    assert b.state_dict()["step"] == 1


@pytest.mark.parametrize("config", ALL, ids=["-".join(c) for c in ALL])
def test_identical_clients_and_single_client_come_back_exactly(config):
    w = torch.tensor([0.1, -0.7, 1.3, 0.0, 2.2])
    client = torch.tensor([0.3, -0.2, 1.1, 0.05, 2.9])
    agg = EWWA(*config)
    for r in (1, 2):
        res = agg.aggregate(RoundInputs.of(w, client.repeat(3, 1), num_samples=SAMPLES, client_ids=torch.tensor([2, 0, 1]), round=r))
        new = res.params
        assert torch.equal(new, client)
        assert torch.all(res.weights >= 0) and torch.isclose(res.weights.sum(), torch.tensor(1.0))
    one = EWWA(*config)
    one_res = one.aggregate(RoundInputs.of(w, client[None], num_samples=SAMPLES[:1], client_ids=torch.tensor([3]), round=1))
    assert torch.equal(one_res.params, client)
    assert torch.equal(one_res.weights, torch.ones(1))


@pytest.mark.parametrize("weighting", WEIGHTINGS)
def test_element_weights_are_non_negative_and_sum_to_one_per_element(weighting):
    agg = EWWA(weighting=weighting)
    b = torch.tensor([[-3.0, 0.0, 50.0, 1e-7], [2.0, 0.0, -50.0, 0.0], [0.5, 0.0, 80.0, -1e-7]])
    p = agg._client_weights(b)
    assert torch.all(p >= 0) and torch.all(torch.isfinite(p))
    assert torch.allclose(p.sum(dim=0), torch.ones(4))
    assert torch.allclose(p[:, 1], torch.full((3,), 1 / 3))  # equal steps, equal weights


@pytest.mark.parametrize("config", ALL, ids=["-".join(c) for c in ALL])
def test_zero_updates_and_large_updates_stay_finite(config):
    w = torch.tensor([0.1, -0.7, 1.3, 0.0, 2.2])
    agg = EWWA(*config)
    assert torch.equal(agg.aggregate(RoundInputs.of(w, w.repeat(3, 1), num_samples=SAMPLES, client_ids=torch.tensor([0, 1, 2]), round=1)).params, w)
    big = w + torch.tensor([[1e3], [-1e3], [5e2]]) * torch.arange(1.0, 6.0)
    res = agg.aggregate(RoundInputs.of(w, big, num_samples=SAMPLES, client_ids=torch.tensor([0, 1, 2]), round=2))
    new = res.params
    assert torch.all(torch.isfinite(new)) and torch.all(torch.isfinite(res.weights))
    assert torch.all(new >= big.min(dim=0).values) and torch.all(new <= big.max(dim=0).values)  # convex per element


@pytest.mark.parametrize("moments", MOMENTS)
def test_state_dict_round_trip_gives_bit_identical_next_round(moments):
    w, deltas = make_rounds([[2, 0, 1], [1, 0, 2]], seed=3)
    W1, W2 = torch.from_numpy(w + deltas[0]), torch.from_numpy(w + deltas[1])
    ids = torch.tensor([2, 0, 1])
    whole = EWWA(optimizer="yogi", moments=moments)
    whole_res = whole.aggregate(RoundInputs.of(torch.from_numpy(w), W1, num_samples=SAMPLES, client_ids=ids, round=1))
    mid = whole_res.params
    state = whole.state_dict()
    whole_res = whole.aggregate(RoundInputs.of(mid, W2 + (mid - torch.from_numpy(w)), num_samples=SAMPLES, client_ids=ids.flip(0), round=2))
    expected = whole_res.params
    resumed = EWWA(optimizer="yogi", moments=moments)
    resumed.load_state_dict(state)
    resumed_res = resumed.aggregate(RoundInputs.of(mid, W2 + (mid - torch.from_numpy(w)), num_samples=SAMPLES, client_ids=ids.flip(0), round=2))
    got = resumed_res.params
    assert torch.equal(got, expected) and torch.equal(resumed_res.weights, whole_res.weights)
    assert state["step"] == 1 and not torch.equal(state["m"], whole.m)  # round 2 moved on from the saved state


def test_buffers_are_averaged_with_sample_shares():
    agg = EWWA()
    res = agg.aggregate(RoundInputs.of(torch.zeros(2), torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), num_samples=SAMPLES, client_ids=torch.tensor([0, 1, 2]), round=1))
    assert torch.allclose(res.weights_for_buffers(), torch.tensor([1 / 6, 1 / 2, 1 / 3]))


def authors_code_round(state, moments, t, clients, b1=0.9, b2=0.999, eps=1e-8):
    """One round of the authors' released aggregation, on dicts of named arrays as their state dicts:
    Adam moments updated client after client over every key, one minimum over all keys, log weights."""
    m, v = moments
    scale = math.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
    steps = []
    for client in clients:
        step = {}
        for k in state:
            g = state[k] - client[k]
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g * g
            step[k] = scale * m[k] / (np.sqrt(v[k]) + eps)
        steps.append(step)
    small = min(float(step[k].min()) for step in steps for k in state)
    new = {}
    for k in state:
        q = [np.log(step[k] - small + 1) + 1e-8 for step in steps]
        new[k] = sum(qi / sum(q) * client[k] for qi, client in zip(q, clients))
    return new


def test_elementwise_buffers_follow_the_authors_code_over_two_rounds():
    # weights and a BatchNorm-like statistic whose update is far below the weights' (it sets the shared minimum)
    state = {"w": np.array([0.5, -1.0, 2.0]), "running_var": np.array([1.0, 1.0])}
    rounds = [[{"w": np.array([0.2, -0.7, 2.5]), "running_var": np.array([3.0, 0.5])},
               {"w": np.array([0.9, -1.4, 1.6]), "running_var": np.array([1.2, 4.0])},
               {"w": np.array([0.4, -0.9, 2.2]), "running_var": np.array([2.0, 2.0])}],
              [{"w": np.array([0.1, -0.5, 2.9]), "running_var": np.array([2.5, 0.8])},
               {"w": np.array([0.7, -1.1, 1.9]), "running_var": np.array([1.5, 3.0])},
               {"w": np.array([0.6, -0.8, 2.4]), "running_var": np.array([2.2, 1.1])}]]
    # their m and v start as the model with only its weights zeroed: the statistic keeps its value
    moments = ({"w": np.zeros(3), "running_var": state["running_var"].copy()},
               {"w": np.zeros(3), "running_var": state["running_var"].copy()})
    agg = EWWA(buffers="elementwise")
    assert agg.needs.buffers and not EWWA().needs.buffers
    ids = torch.tensor([2, 0, 1])  # listed out of id order: the moments run in ascending id
    order = [1, 2, 0]  # position of ids 0, 1, 2
    params, buffers = torch.tensor(state["w"]), torch.tensor(state["running_var"])
    samples_agg, elementwise, plain = EWWA(), [], []
    for t, clients in enumerate(rounds):
        expected = authors_code_round(state, moments, t, [clients[k] for k in order])
        listed = [clients[k] for k in range(3)]
        inputs = RoundInputs.of(params, torch.tensor(np.stack([c["w"] for c in listed])), client_ids=ids, round=t + 1,
                                global_buffers=buffers,
                                client_buffers=torch.tensor(np.stack([c["running_var"] for c in listed])))
        plain.append(samples_agg.aggregate(RoundInputs.of(params, inputs.client_params, client_ids=ids, round=t + 1)).params.numpy())
        res = agg.aggregate(inputs)
        params = res.params
        elementwise.append(params.numpy())
        buffers = combine_buffers(inputs.client_buffers, res.weights_for_buffers())
        assert np.allclose(params.numpy(), expected["w"], rtol=1e-12, atol=1e-12)
        assert np.allclose(buffers.numpy(), expected["running_var"], rtol=1e-12, atol=1e-12)
        state = expected
    # the statistic is not the data-weighted mean `buffers: samples` gives (which the reference would fail)
    listed = np.stack([c["running_var"] for c in rounds[-1]])
    assert not np.allclose(buffers.numpy(), listed.mean(axis=0), atol=1e-3)
    # here the statistic's steps never undercut the weights' minimum, so the weights match `buffers: samples`
    assert all(np.allclose(a, b, rtol=1e-12) for a, b in zip(elementwise, plain))


def test_a_statistic_can_set_the_shared_minimum_and_so_move_the_weights():
    # every weight moved down on every client (steps > 0); the running mean moved up (steps < 0)
    state = {"w": np.array([1.0, 2.0]), "running_mean": np.array([0.0])}
    clients = [{"w": np.array([0.5, 1.0]), "running_mean": np.array([0.3])},
               {"w": np.array([0.9, 1.2]), "running_mean": np.array([0.1])}]
    moments = ({"w": np.zeros(2), "running_mean": np.zeros(1)}, {"w": np.zeros(2), "running_mean": np.zeros(1)})
    expected = authors_code_round(state, moments, 0, clients)
    inputs = RoundInputs.of(torch.tensor(state["w"]), torch.tensor(np.stack([c["w"] for c in clients])),
                            global_buffers=torch.tensor(state["running_mean"]),
                            client_buffers=torch.tensor(np.stack([c["running_mean"] for c in clients])))
    together = EWWA(buffers="elementwise").aggregate(inputs).params
    apart = EWWA().aggregate(inputs).params
    assert np.allclose(together.numpy(), expected["w"], rtol=1e-12, atol=1e-12)
    assert not np.allclose(together.numpy(), apart.numpy(), atol=1e-3)


def test_elementwise_buffers_without_them_declared_is_a_clear_error():
    with pytest.raises(ValueError, match=r"reads inputs.global_buffers but does not declare it"):
        EWWA(buffers="elementwise").aggregate(RoundInputs.of(torch.zeros(2), torch.ones(2, 2)))


@pytest.mark.parametrize(
    "kwargs, key",
    [({"optimizer": "sgd"}, "optimizer"), ({"moments": "mean"}, "moments"), ({"weighting": "uniform"}, "weighting"),
     ({"lr": 0.0}, "lr"), ({"beta1": 1.0}, "beta1"), ({"beta2": -0.1}, "beta2"), ({"eps": 0.0}, "eps"),
     ({"buffers": "mean"}, "buffers")],
)
def test_bad_options_raise_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=rf"aggregator\.{key}="):
        EWWA(**kwargs)


def test_defaults_are_specs():
    agg = EWWA()
    assert (agg.optimizer, agg.moments, agg.weighting) == ("adam", "shared_sequential", "log_shift")
    assert (agg.lr, agg.beta1, agg.beta2, agg.eps) == (1.0, 0.9, 0.999, 1e-8)
    assert agg.buffers == "samples"


def test_weight_quantiles_interpolate_and_sample_evenly(monkeypatch):
    row = torch.tensor([0.0, 0.1, 0.2, 0.3, 0.4])
    p = torch.stack([row, 1 - row])  # sorted: 0 .1 .2 .3 .4 .6 .7 .8 .9 1
    q = ewwa.weight_quantiles(p)
    assert q == pytest.approx({"weight_q10": 0.09, "weight_q50": 0.5, "weight_q90": 0.91})
    monkeypatch.setattr(ewwa, "QUANTILE_SAMPLE", 5)  # every 2nd weight: 0 .2 .4 .9 .7
    assert ewwa.weight_quantiles(p)["weight_q50"] == pytest.approx(0.4)


def test_reports_its_weight_quantiles_each_round():
    agg = EWWA()
    res = agg.aggregate(RoundInputs.of(torch.zeros(4), torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.5, 1.0, -1.0, 2.0]])))
    reported = res.metrics
    p = res.weights
    assert set(reported) == {"weight_q10", "weight_q50", "weight_q90"}
    assert 0 <= reported["weight_q10"] <= reported["weight_q50"] <= reported["weight_q90"] <= 1
    assert reported["weight_q10"] < 0.5 < reported["weight_q90"]  # element-wise: not the uniform 1/2 everywhere
    assert p.shape == (2,)


@pytest.mark.slow  # ~15-20 s on 2 idle cores
def test_elementwise_buffers_reach_a_batchnorm_models_statistics(tmp_path):
    from conftest import compose_config
    from fedagg.run import train

    # element-wise weights turn float-level differences between the engines into different weights, so
    # this checks the loop's plumbing (needs -> inputs -> [K, B] weights -> statistics) in one engine
    base = ["rounds=1", "device=cpu", "model=cnn_fednnnn_cifar", "num_clients=3", "aggregator=ewwa", "experiment_scale=0.5"]
    train(compose_config(*base, "aggregator.buffers=elementwise"), tmp_path / "elementwise")
    train(compose_config(*base), tmp_path / "samples")
    a, b = (torch.load(tmp_path / name / "model.pt") for name in ("elementwise", "samples"))
    stats = [k for k in a if k.endswith("running_var")]
    assert len(stats) == 6 and all(not torch.allclose(a[k], b[k], atol=1e-7) for k in stats)
