"""FedAdp against a float64 numpy transcription of SPEC "FedAdp", plus its invariants."""

import math

import numpy as np
import pytest
import torch

from fedagg import RoundInputs
from fedagg.aggregators.base import FedAvg
from fedagg.aggregators.fedadp import FedAdp

W0 = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0])
ROUND1 = torch.tensor([[1.5, -0.5, 2.0, 0.3, 0.0], [0.0, -1.0, 3.0, 0.2, 1.5], [0.4, 0.5, 1.0, -0.6, 1.2]])
ROUND2 = torch.tensor([[0.2, 0.1, 2.5, 0.9, 0.4], [1.0, -2.0, 2.0, 0.0, 1.0], [0.7, 0.0, 1.4, 0.1, 0.8]])
SAMPLES = torch.tensor([10, 30, 20])
IDS = torch.tensor([0, 1, 2])


def reference(w, W, n, ids, r, angles, counts, alpha=5.0, smoothing="round", use_sizes=True):
    """SPEC's FedAdp in float64; updates the per-id dicts `angles` and `counts` in place."""
    w, W, n = np.asarray(w, np.float64), np.asarray(W, np.float64), np.asarray(n, np.float64)
    delta = W - w
    g = (n / n.sum()) @ delta
    psi_raw = []
    for k, i in enumerate(ids):
        norms = np.linalg.norm(g) * np.linalg.norm(delta[k])
        theta = 0.0 if norms == 0 else math.acos(min(1.0, max(-1.0, float(g @ delta[k]) / norms)))
        counts[i] = counts.get(i, 0) + 1
        t = r if smoothing == "round" else counts[i]
        angles[i] = theta if i not in angles else (t - 1) / t * angles[i] + theta / t
        f = alpha * (1 - math.exp(-math.exp(-alpha * (angles[i] - 1))))
        psi_raw.append((n[k] if use_sizes else 1.0) * math.exp(f))
    psi = np.array(psi_raw) / sum(psi_raw)
    return w + psi @ delta, psi


def run(agg, w, W, n, ids, r):
    return agg.aggregate(RoundInputs.of(w, W, num_samples=n, client_ids=ids, round=r))


@pytest.mark.parametrize("smoothing", ["round", "participation"])
@pytest.mark.parametrize("use_sizes", [True, False])
def test_two_rounds_match_spec(smoothing, use_sizes):
    agg, angles, counts = FedAdp(smoothing=smoothing, use_sizes=use_sizes), {}, {}
    res = run(agg, W0, ROUND1, SAMPLES, IDS, 1)
    w1 = res.params
    exp1, psi1 = reference(W0, ROUND1, SAMPLES, [0, 1, 2], 1, angles, counts, smoothing=smoothing, use_sizes=use_sizes)
    assert np.allclose(w1.numpy(), exp1, atol=1e-5) and np.allclose(res.weights.numpy(), psi1, atol=1e-6)
    res = run(agg, w1, ROUND2, SAMPLES, IDS, 2)
    w2 = res.params
    exp2, psi2 = reference(w1, ROUND2, SAMPLES, [0, 1, 2], 2, angles, counts, smoothing=smoothing, use_sizes=use_sizes)
    assert np.allclose(w2.numpy(), exp2, atol=1e-5) and np.allclose(res.weights.numpy(), psi2, atol=1e-6)
    assert res.metrics == {"angle": pytest.approx(np.mean([angles[i] for i in (0, 1, 2)]), rel=1e-5)}
    assert not np.allclose(psi2, SAMPLES.numpy() / SAMPLES.sum().item(), atol=1e-3)  # the angles matter


def test_smaller_angle_gets_larger_weight():
    # clients 0 and 1 point along the mean, client 2 at right angles to it: equal sizes, so only f differs
    W = W0 + torch.tensor([[1.0, 1.0, 0, 0, 0], [1.0, 1.0, 0, 0, 0], [0.5, -0.5, 0, 0, 0]])
    agg = FedAdp()
    res = run(agg, W0, W, torch.tensor([5, 5, 5]), IDS, 1)
    assert res.weights[0] == res.weights[1] > res.weights[2] > 0


@pytest.mark.parametrize("samples", [[5, 5, 5], [1, 2, 3]])
def test_equal_angles_give_fedavg(samples):
    # orthogonal updates of length 1/n_k: the D-weighted mean is (1,1,1,0,0)/sum(n), so every client
    # is at the same angle to it, every round (with equal sizes: orthogonal updates of equal norm)
    n = torch.tensor(samples)
    eye = torch.eye(3, 5) / n[:, None]
    agg, avg, w_adp, w_avg = FedAdp(), FedAvg(), W0, W0
    for r in (1, 2):
        res, avg_res = run(agg, w_adp, w_adp + eye, n, IDS, r), run(avg, w_avg, w_avg + eye, n, IDS, r)
        w_adp, w_avg = res.params, avg_res.params
        assert torch.allclose(res.weights, avg_res.weights, atol=1e-7)
        assert torch.allclose(w_adp, w_avg, atol=1e-6)


@pytest.mark.parametrize("smoothing", ["round", "participation"])
def test_partial_participation_keeps_angles_per_id(smoothing):
    agg, angles, counts = FedAdp(smoothing=smoothing), {}, {}
    res = run(agg, W0, ROUND1, SAMPLES, IDS, 1)
    w = res.params
    reference(W0, ROUND1, SAMPLES, [0, 1, 2], 1, angles, counts, smoothing=smoothing)
    res = run(agg, w, ROUND2[1:], SAMPLES[1:], torch.tensor([2, 5]), 2)  # client 5 is new, client 2 returns
    w_ = res.params
    expected, _ = reference(w, ROUND2[1:], SAMPLES[1:], [2, 5], 2, angles, counts, smoothing=smoothing)
    assert np.allclose(w_.numpy(), expected, atol=1e-5)
    # client 5 at round 3 has taken part once before: t = 3 (round) or 2 (participation)
    res = run(agg, w_, ROUND1[:2], SAMPLES[:2], torch.tensor([5, 0]), 3)
    w3 = res.params
    expected, _ = reference(w_, ROUND1[:2], SAMPLES[:2], [5, 0], 3, angles, counts, smoothing=smoothing)
    assert np.allclose(w3.numpy(), expected, atol=1e-5)
    assert agg.counts == {0: 2, 1: 1, 2: 2, 5: 2}
    assert {i: round(float(a), 5) for i, a in agg.angles.items()} == {i: round(a, 5) for i, a in angles.items()}


def test_participation_and_round_smoothing_differ_once_a_client_skips_rounds():
    outs = []
    for smoothing in ("round", "participation"):
        agg = FedAdp(smoothing=smoothing)
        res = run(agg, W0, ROUND1, SAMPLES, IDS, 1)
        w = res.params
        res = run(agg, w, ROUND2[1:], SAMPLES[1:], torch.tensor([2, 5]), 2)
        w = res.params
        outs.append(run(agg, w, ROUND1[:2], SAMPLES[:2], torch.tensor([5, 0]), 3).params)
    assert not torch.allclose(outs[0], outs[1], atol=1e-6)


def test_state_dict_round_trip_is_bit_identical():
    agg = FedAdp(smoothing="participation")
    res = run(agg, W0, ROUND1, SAMPLES, IDS, 1)
    w1 = res.params
    resumed = FedAdp(smoothing="participation")
    resumed.load_state_dict(agg.state_dict())
    assert torch.equal(run(resumed, w1, ROUND2, SAMPLES, IDS, 2).params, run(agg, w1, ROUND2, SAMPLES, IDS, 2).params)
    assert FedAdp().state_dict() == {"angles": {}, "counts": {}}


def test_numerically_safe_cases():
    FedAdp_res = run(FedAdp(), W0, W0.repeat(3, 1), SAMPLES, IDS, 1)  # every norm is 0: all angles 0
    zero = FedAdp_res.params
    assert torch.equal(zero, W0)
    same = FedAdp()
    same_res = run(same, W0, ROUND1[:1].repeat(3, 1), SAMPLES, IDS, 1)
    out = same_res.params
    assert torch.allclose(out, ROUND1[0], atol=1e-6) and torch.isfinite(same_res.weights).all()
    assert torch.allclose(same_res.weights, SAMPLES / SAMPLES.sum())
    one = FedAdp()
    for r in (1, 2):
        one_res = run(one, W0, ROUND1[1:2], SAMPLES[1:2], IDS[1:2], r)
        out = one_res.params
        assert torch.allclose(out, ROUND1[1], atol=1e-6) and torch.equal(one_res.weights, torch.ones(1))
    # opposite updates: the mean is 0, so SPEC's zero-norm rule gives angle 0, not NaN
    FedAdp_res = run(FedAdp(), W0, torch.stack([W0 + 1, W0 - 1]), torch.tensor([4, 4]), IDS[:2], 1)
    opposite = FedAdp_res.params
    assert torch.allclose(opposite, W0)


@pytest.mark.parametrize(
    "kwargs, key", [({"alpha": 0}, "alpha"), ({"alpha": -5.0}, "alpha"), ({"smoothing": "ema"}, "smoothing"),
                    ({"use_sizes": "yes"}, "use_sizes")]
)
def test_bad_options_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=rf"aggregator\.{key}="):
        FedAdp(**kwargs)


def test_defaults_are_specs():
    agg = FedAdp()
    assert (agg.alpha, agg.smoothing, agg.use_sizes) == (5.0, "round", True)
