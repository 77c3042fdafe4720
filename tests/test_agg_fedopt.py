"""Server optimizers (FedAvgM, FedAdam, FedYogi, FedAdagrad, FedAMS, FedCAMS) against numpy
formulas written from SPEC, over two rounds, plus resume, partial participation and safety."""

import io
import re

import numpy as np
import pytest
import torch

from fedagg import RoundInputs
from fedagg.aggregators.base import FedAvg
from fedagg.aggregators.fedams import FedAMS, FedCAMS
from fedagg.aggregators.fedopt import FedAdagrad, FedAdam, FedAvgM, FedYogi
from uploads import through_channel

W0 = np.array([0.5, -1.0, 2.0, 0.0, 1.0])
# Client updates Delta_k per round; the last element never moves (a zero pseudo-gradient).
# g2^2 lies above Yogi's v1 on elements 1, 2 and below it on 0, 3, so sign(v - g^2) takes both
# signs in round 2; |g2| < sqrt(0.01) |g1| on element 0, so FedAdam's v shrinks there (v_hat's max).
D1 = np.array([[0.5, 0.4, -0.3, 0.2, 0.0], [0.1, -0.2, 0.6, 0.3, 0.0], [0.3, 0.1, 0.2, -0.4, 0.0]])
D2 = np.array([[0.01, 0.3, -0.2, 0.02, 0.0], [0.03, -0.1, 0.4, 0.01, 0.0], [-0.01, 0.2, 0.1, 0.0, 0.0]])
SAMPLES = torch.tensor([1, 2, 1])
P_SAMPLES = np.array([0.25, 0.5, 0.25])
IDS = torch.tensor([0, 1, 2])


def run(agg, deltas=(D1, D2), ids=(IDS, IDS), samples=(SAMPLES, SAMPLES), rounds=None):
    """Feed round r's clients as w_r + Delta; return every round's result (`params` the new global)."""
    w, outs = torch.tensor(W0, dtype=torch.float32), []
    for r, (d, i, n) in enumerate(zip(deltas, ids, samples), start=1):
        res = through_channel(agg, RoundInputs.of(w, w + torch.tensor(d, dtype=torch.float32), num_samples=n, client_ids=i, round=r if rounds is None else rounds[r - 1]))
        w = res.params
        outs.append(res)
    return outs


def params(results):
    return [r.params for r in results]


def close(out, ref):
    assert torch.allclose(out, torch.tensor(ref, dtype=torch.float32), rtol=1e-5, atol=1e-5), (out, ref)


# --- reference formulas (SPEC), float64 -------------------------------------------------------

def ref_fedavgm(p, lr, gamma):
    w, b, outs = W0.copy(), np.zeros(5), []
    for d in (D1, D2):
        b = gamma * b + p @ d
        w = w + lr * b
        outs.append(w)
    return outs


def ref_fedopt(rule, p, lr=1e-2, b1=0.9, b2=0.99, tau=1e-3, bc=False):
    w, m, v, outs = W0.copy(), np.zeros(5), np.full(5, 0.0 if bc else tau**2), []
    for r, d in enumerate((D1, D2), start=1):
        g = p @ d
        m = b1 * m + (1 - b1) * g
        v = {"adam": b2 * v + (1 - b2) * g * g, "yogi": v - (1 - b2) * g * g * np.sign(v - g * g),
             "adagrad": v + g * g}[rule]
        mh, vh = (m / (1 - b1**r), v / (1 - b2**r)) if bc else (m, v)
        den = np.sqrt(vh) + tau
        w = w + lr * np.divide(mh, den, out=np.zeros(5), where=den > 0)  # 0/0 (tau = 0, g = 0) moves nothing
        outs.append(w)
    return outs


class RefAMS:
    def __init__(self, lr=1.0, b1=0.9, b2=0.99, eps=1e-3, bc=False):
        self.lr, self.b1, self.b2, self.eps, self.bc = lr, b1, b2, eps, bc
        self.m, self.v, self.vhat, self.r = np.zeros(5), np.zeros(5), np.full(5, eps), 0

    def step(self, w, g):
        self.r += 1
        self.m = self.b1 * self.m + (1 - self.b1) * g
        self.v = self.b2 * self.v + (1 - self.b2) * g * g
        self.vhat = np.maximum(np.maximum(self.vhat, self.v), self.eps)
        c1, c2 = (1 - self.b1**self.r, 1 - self.b2**self.r) if self.bc else (1.0, 1.0)
        return w + self.lr * (self.m / c1) / np.sqrt(self.vhat / c2)


def sign_c(x):
    return np.sign(x) * np.abs(x).sum() / x.size


def topk_c(k):
    def c(x):
        out = np.zeros_like(x)
        keep = np.argsort(-np.abs(x))[:k]
        out[keep] = x[keep]
        return out
    return c


def ref_fedcams(compress, deltas, ids, ps, **ams):
    opt, errors, w, outs = RefAMS(**ams), {}, W0.copy(), []
    for d, round_ids, p in zip(deltas, ids, ps):
        sent = []
        for row, i in zip(d, round_ids):
            x = row + errors.get(i, 0.0)
            sent.append(compress(x))
            errors[i] = x - sent[-1]
        w = opt.step(w, p @ np.array(sent))
        outs.append(w)
    return outs, errors


# --- two rounds against the formulas -----------------------------------------------------------

def test_fedavgm_two_rounds():
    for kwargs, lr, gamma in (({}, 1.0, 0.9), ({"lr": 0.5, "momentum": 0.6}, 0.5, 0.6)):
        for out, ref in zip(params(run(FedAvgM(**kwargs))), ref_fedavgm(P_SAMPLES, lr, gamma)):
            close(out, ref)


def test_fedavgm_without_momentum_is_fedavg():
    for a, b in zip(params(run(FedAvgM(momentum=0.0))), params(run(FedAvg()))):
        close(a, b.double().numpy())


@pytest.mark.parametrize("cls, rule", [(FedAdam, "adam"), (FedYogi, "yogi"), (FedAdagrad, "adagrad")])
@pytest.mark.parametrize("kwargs", [
    {},  # defaults: lr 1e-2, beta1 0.9, beta2 0.99, tau 1e-3, paper form
    {"lr": 0.1, "beta1": 0.8, "beta2": 0.9, "tau": 0.05},
    {"lr": 0.1, "tau": 0.0},  # zero-pseudo-gradient element: 0/0 must be a zero step
    {"lr": 1e-3, "tau": 0.0, "bias_correction": True},  # the ewwa-fl baseline setting
    {"tau": 0.05, "bias_correction": True},
])
def test_fedopt_two_rounds(cls, rule, kwargs):
    short = {"lr": "lr", "beta1": "b1", "beta2": "b2", "tau": "tau", "bias_correction": "bc"}
    refs = ref_fedopt(rule, P_SAMPLES, **{short[k]: v for k, v in kwargs.items()})
    agg = cls(**kwargs)
    results = run(agg)
    for out, ref in zip(params(results), refs):
        close(out, ref)
    assert agg.steps == 2 and torch.allclose(results[-1].weights, torch.tensor(P_SAMPLES, dtype=torch.float32))


def test_fedopt_uniform_weighting():
    refs = ref_fedopt("adam", np.full(3, 1 / 3))
    for out, ref in zip(params(run(FedAdam(weighting="uniform"))), refs):
        close(out, ref)


def test_bias_correction_counts_server_steps_not_the_round_argument():
    refs = ref_fedopt("adam", P_SAMPLES, tau=0.05, bc=True)
    for out, ref in zip(params(run(FedAdam(tau=0.05, bias_correction=True), rounds=[7, 9])), refs):
        close(out, ref)


@pytest.mark.parametrize("kwargs, ref_kwargs", [
    ({}, {}),  # eps = 1e-3 is above every v here: v_hat stays eps
    ({"eps": 1e-4}, {"eps": 1e-4}),  # element 0: v falls in round 2, v_hat keeps round 1's
    ({"eps": 1e-4, "bias_correction": True, "lr": 0.3}, {"eps": 1e-4, "bc": True, "lr": 0.3}),
    ({"beta1": 0.5, "beta2": 0.9, "weighting": "uniform"}, {"b1": 0.5, "b2": 0.9}),
])
def test_fedams_two_rounds(kwargs, ref_kwargs):
    p = np.full(3, 1 / 3) if kwargs.get("weighting") == "uniform" else P_SAMPLES
    ref, w, refs = RefAMS(**ref_kwargs), W0.copy(), []
    for d in (D1, D2):
        w = ref.step(w, p @ d)
        refs.append(w)
    agg = FedAMS(**kwargs)
    for out, r in zip(params(run(agg)), refs):
        close(out, r)
    close(agg.v_hat, ref.vhat)


def test_fedams_max_keeps_the_larger_old_v():
    agg = FedAMS(eps=1e-4)
    run(agg)
    assert agg.v_hat[0] > agg.v[0]  # v shrank, the denominator did not


@pytest.mark.parametrize("kwargs, compress", [
    ({}, sign_c),
    ({"compressor": "topk", "ratio": 0.4}, topk_c(2)),  # 0.4 * 5 = 2 entries
    ({"compressor": "topk", "ratio": 0.5}, topk_c(2)),  # 2.5 entries: rounded down
    ({"compressor": "topk"}, topk_c(1)),  # 5 / 64 < 1: at least one entry
    ({"compressor": "sign", "eps": 1e-4, "bias_correction": True}, sign_c),
])
def test_fedcams_two_rounds(kwargs, compress):
    ams = {"eps": kwargs.get("eps", 1e-3), "bc": kwargs.get("bias_correction", False)}
    refs, errors = ref_fedcams(compress, (D1, D2), ([0, 1, 2], [0, 1, 2]), (P_SAMPLES, P_SAMPLES), **ams)
    agg = FedCAMS(**kwargs)
    results = run(agg)
    for out, ref in zip(params(results), refs):
        close(out, ref)
    assert set(agg.feedback.memory.rows) == {0, 1, 2}
    for i in errors:
        close(agg.feedback.memory.rows[i], errors[i])
    assert torch.allclose(results[-1].weights, torch.tensor(P_SAMPLES, dtype=torch.float32))
    held_back = np.mean([np.linalg.norm(np.asarray(errors[i], np.float64)) for i in errors])  # after round 2
    assert results[-1].metrics["error_norm"] == pytest.approx(held_back, rel=1e-5)


@pytest.mark.parametrize("compressor, compress", [("sign", sign_c), ("topk", topk_c(2))])
def test_fedcams_partial_participation_keeps_errors_per_id(compressor, compress):
    # Round 1: clients 0, 1, 2. Round 2: clients 5 (new: e = 0) and 2 (its own e), in that order.
    ids = ([0, 1, 2], [5, 2])
    samples = (SAMPLES, torch.tensor([3, 1]))
    refs, errors = ref_fedcams(compress, (D1, D2[:2]), ids, (P_SAMPLES, np.array([0.75, 0.25])))
    agg = FedCAMS(compressor=compressor, ratio=0.4)
    for r, (d, i, n) in enumerate(zip((D1, D2[:2]), ids, samples), start=1):
        w = torch.tensor(W0 if r == 1 else refs[0], dtype=torch.float32)
        res = through_channel(agg, RoundInputs.of(w, w + torch.tensor(d, dtype=torch.float32), num_samples=n, client_ids=torch.tensor(i), round=r))
        out = res.params
        close(out, refs[r - 1])
        if r == 1:
            after_one = {k: e.clone() for k, e in agg.feedback.memory.rows.items()}
    assert set(agg.feedback.memory.rows) == {0, 1, 2, 5}
    for i in (0, 1):  # absent in round 2: untouched
        assert torch.equal(agg.feedback.memory.rows[i], after_one[i])
    for i in (2, 5):
        close(agg.feedback.memory.rows[i], errors[i])
    close(agg.feedback.memory.rows[5], D2[0] - compress(D2[0]))  # first-time treatment: nothing carried over


# --- invariants --------------------------------------------------------------------------------

ALL = {
    "fedavgm": lambda: FedAvgM(),
    "fedadam": lambda: FedAdam(),
    "fedadam_bc_tau0": lambda: FedAdam(tau=0.0, bias_correction=True),
    "fedyogi": lambda: FedYogi(tau=0.0),
    "fedadagrad": lambda: FedAdagrad(bias_correction=True),
    "fedams": lambda: FedAMS(eps=1e-4, bias_correction=True),
    "fedcams_sign": lambda: FedCAMS(),
    "fedcams_topk": lambda: FedCAMS(compressor="topk", ratio=0.4),
}


@pytest.mark.parametrize("name", ALL)
def test_state_dict_round_trip_resumes_bit_identically(name):
    ids = (IDS, torch.tensor([2, 5, 0]))  # a new id in round 2 as well
    w0 = torch.tensor(W0, dtype=torch.float32)
    c1, c2 = (torch.tensor(d, dtype=torch.float32) for d in (D1, D2))
    first = ALL[name]()
    first_res = through_channel(first, RoundInputs.of(w0, w0 + c1, num_samples=SAMPLES, client_ids=ids[0], round=1))
    w1 = first_res.params
    buffer = io.BytesIO()
    # as a checkpoint would: the rule's state and its channel stages' (FedCAMS's e_k)
    torch.save({"rule": first.state_dict(), "stages": [s.state_dict() for s in first.channel_stages()]}, buffer)
    first_res = through_channel(first, RoundInputs.of(w1, w1 + c2, num_samples=SAMPLES, client_ids=ids[1], round=2))
    expected = first_res.params
    buffer.seek(0)
    resumed = ALL[name]()
    saved = torch.load(buffer)
    resumed.load_state_dict(saved["rule"])
    for stage, state in zip(resumed.channel_stages(), saved["stages"]):
        stage.load_state_dict(state)
    resumed_res = through_channel(resumed, RoundInputs.of(w1, w1 + c2, num_samples=SAMPLES, client_ids=ids[1], round=2))
    assert torch.equal(resumed_res.params, expected)
    assert torch.equal(resumed_res.weights, first_res.weights)


@pytest.mark.parametrize("name", ALL)
def test_numerically_safe(name):
    w0 = torch.tensor(W0, dtype=torch.float32)
    zero = params(run(ALL[name](), deltas=(np.zeros((3, 5)), np.zeros((3, 5)))))
    assert all(torch.equal(w, w0) for w in zero)  # nothing to follow: nothing moves
    single = params(run(ALL[name](), deltas=(D1[:1], D2[:1]), ids=(IDS[:1], IDS[:1]), samples=(SAMPLES[:1], SAMPLES[:1])))
    same = params(run(ALL[name](), deltas=(D1[[0, 0, 0]], D2[[0, 0, 0]])))
    for a, b in zip(same, single):  # identical clients behave as that one client
        assert torch.isfinite(a).all() and torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    agg = ALL[name]()
    res = run(agg)[-1]
    assert (res.weights >= 0).all() and torch.isclose(res.weights.sum(), torch.tensor(1.0))


def test_the_largest_tau_and_v_init_allowed_stay_finite_float32():
    # tau = 1e19 starts v at tau^2 = 1e38 (float32 holds up to 3.4e38); the step m / (sqrt(v) + tau) is then tiny
    for rule in (FedAdam(tau=1e19), FedYogi(v_init=1e38), FedAdagrad(tau=1e19, v_init=1e38)):
        out = params(run(rule))
        assert all(torch.isfinite(p).all() for p in out)
        assert torch.allclose(out[-1], torch.tensor(W0, dtype=torch.float32), atol=1e-6)  # moved by at most ~1e-19


@pytest.mark.parametrize("cls, kwargs, key", [
    (FedAvgM, {"lr": 0.0}, "lr"),
    (FedAvgM, {"momentum": 1.0}, "momentum"),
    (FedAvgM, {"momentum": -0.1}, "momentum"),
    (FedAvgM, {"weighting": "size"}, "weighting"),
    (FedAdam, {"lr": -1.0}, "lr"),
    (FedAdam, {"beta1": 1.0}, "beta1"),
    (FedYogi, {"beta2": 1.5}, "beta2"),
    (FedAdagrad, {"tau": -1e-3}, "tau"),
    (FedAdam, {"tau": 1e300}, "tau"),  # tau^2 starts v, a float32: tau**2 overflowed (OverflowError)
    (FedAdam, {"tau": 1.1e19}, "tau"),
    (FedAdam, {"v_init": 1e300}, "v_init"),  # v is a float32: torch.full_like raised a RuntimeError in round 1
    (FedAdam, {"v_init": 1e40}, "v_init"),
    (FedAdam, {"bias_correction": "yes"}, "bias_correction"),
    (FedAMS, {"eps": 0.0}, "eps"),
    (FedAMS, {"beta2": -0.5}, "beta2"),
    (FedCAMS, {"compressor": "qsgd"}, "compressor"),
    (FedCAMS, {"ratio": 0.0}, "ratio"),
    (FedCAMS, {"ratio": 1.5}, "ratio"),
])
def test_bad_values_name_the_key(cls, kwargs, key):
    value = next(iter(kwargs.values()))
    with pytest.raises(ValueError, match=re.escape(f"aggregator.{key}={value!r} is not allowed")):
        cls(**kwargs)


@pytest.mark.parametrize("name, cls, defaults", [
    ("fedavgm", FedAvgM, {"lr": 1.0, "momentum": 0.9}),
    ("fedadam", FedAdam, {"lr": 1e-2, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3, "bias_correction": False}),
    ("fedyogi", FedYogi, {"lr": 1e-2, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3, "bias_correction": False}),
    ("fedadagrad", FedAdagrad, {"lr": 1e-2, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3, "bias_correction": False}),
    ("fedams", FedAMS, {"lr": 1.0, "beta1": 0.9, "beta2": 0.99, "eps": 1e-3, "bias_correction": False}),
    ("fedcams", FedCAMS, {"lr": 1.0, "eps": 1e-3, "compressor": "sign", "ratio": 1 / 64}),
])
def test_defaults_are_specs(name, cls, defaults):
    agg = cls()
    assert agg.weighting == "samples"
    for key, value in defaults.items():
        assert getattr(agg, key) == value, key
