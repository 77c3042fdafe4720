"""FedNNNN, Norm-Norm and Momentum against a numpy transcription of SPEC "FedNNNN"."""

import numpy as np
import pytest
import torch

from fedagg import RoundInputs
from fedagg.aggregators.fednnnn import FedMomentum, FedNNNN, NormNorm

W0 = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0])
ROUND1 = torch.tensor([[1.5, -0.5, 2.0, 0.3, 0.0], [0.0, -1.0, 3.0, 0.2, 1.5], [0.4, 0.5, 1.0, -0.6, 1.2]])
ROUND2 = torch.tensor([[0.2, 0.1, 2.5, 0.9, 0.4], [1.0, -2.0, 2.0, 0.0, 1.0], [0.7, 0.0, 1.4, 0.1, 0.8]])
SAMPLES = torch.tensor([10, 30, 20])
IDS = torch.tensor([0, 1, 2])


def reference(w, W, n, d, beta, gamma, weighting="uniform", stretch=True):
    """One round of SPEC's rule in float64: returns (new w, new d, p)."""
    w, W, n = np.asarray(w, np.float64), np.asarray(W, np.float64), np.asarray(n, np.float64)
    p = n / n.sum() if weighting == "samples" else np.full(len(n), 1 / len(n))
    delta = W - w
    a = p @ delta
    N = np.linalg.norm(a)
    E = sum(p[k] * np.linalg.norm(delta[k]) for k in range(len(p)))
    factor = (beta * E / N if N >= 1e-12 else 0.0) if stretch else 1.0
    d = gamma * d + factor * a
    return w + d, d, p


def run(agg, w, W, n=SAMPLES, ids=IDS, r=1):
    return agg.aggregate(RoundInputs.of(w, W, num_samples=n, client_ids=ids, round=r))


CASES = [
    (lambda: FedNNNN(), 0.7, 0.8, "uniform", True),
    (lambda: FedNNNN(beta=1.1, gamma=0.6, weighting="samples"), 1.1, 0.6, "samples", True),
    (lambda: NormNorm(beta=0.9), 0.9, 0.0, "uniform", True),
    (lambda: FedMomentum(gamma=0.9, weighting="samples"), None, 0.9, "samples", False),
]


@pytest.mark.parametrize("make, beta, gamma, weighting, stretch", CASES, ids=["fednnnn", "samples", "norm", "momentum"])
def test_three_rounds_match_spec(make, beta, gamma, weighting, stretch):
    agg, w, w_ref, d = make(), W0, W0.numpy().astype(np.float64), 0.0
    for r, W in enumerate([ROUND1, ROUND2, ROUND1 * 0.5], start=1):
        res = run(agg, w, W, r=r)
        w = res.params
        w_ref, d, p = reference(w_ref, W.numpy(), SAMPLES.numpy(), d, beta, gamma, weighting, stretch)
        assert np.allclose(w.numpy(), w_ref, atol=1e-5)
        assert np.allclose(res.weights.numpy(), p)


def test_stretch_restores_the_mean_norm_of_orthogonal_updates():
    # beta=1, gamma=0: three orthogonal updates of norm 2 average to norm 2/sqrt(3); FedNNNN moves by 2
    W = W0 + 2 * torch.eye(3, 5)
    agg = FedNNNN(beta=1.0, gamma=0.0)
    res = run(agg, W0, W)
    new = res.params
    assert res.metrics == {"scale": pytest.approx(3**0.5)}  # beta E / N = 2 / (2 / sqrt 3)
    mean = (W - W0).mean(dim=0)
    assert torch.allclose(torch.linalg.vector_norm(new - W0), torch.tensor(2.0))
    assert torch.allclose(new - W0, mean * 3**0.5)  # same direction as the mean update


def test_norm_norm_moves_exactly_beta_times_E():
    NormNorm_res = run(NormNorm(beta=0.7), W0, ROUND1)
    new = NormNorm_res.params
    e = torch.linalg.vector_norm(ROUND1 - W0, dim=1).mean()
    assert torch.allclose(torch.linalg.vector_norm(new - W0), 0.7 * e)


def test_momentum_carries_over_and_is_reported_as_state():
    agg = FedMomentum(gamma=0.5)
    res = run(agg, W0, ROUND1)
    w1 = res.params
    step1 = w1 - W0
    assert torch.allclose(step1, (ROUND1 - W0).mean(dim=0))
    res = run(agg, w1, w1.repeat(3, 1), r=2)  # clients did not move: only the momentum acts
    w2 = res.params
    assert torch.allclose(w2 - w1, 0.5 * step1)
    assert torch.allclose(agg.state_dict()["momentum"], w2 - w1)


@pytest.mark.parametrize("make", [FedNNNN, NormNorm, FedMomentum])
def test_state_dict_round_trip_is_bit_identical(make):
    agg = make()
    res = run(agg, W0, ROUND1)
    w1 = res.params
    resumed = make()
    resumed.load_state_dict(agg.state_dict())
    assert torch.equal(run(resumed, w1, ROUND2, r=2).params, run(agg, w1, ROUND2, r=2).params)
    assert make().state_dict() == {"momentum": None}


def test_tiny_mean_update_is_not_normalised():
    # opposite updates cancel: N = 0 < 1e-12, so the stretched term is 0 and only momentum moves w
    opposite = torch.stack([W0 + 1, W0 - 1])
    agg = FedNNNN(gamma=0.5)
    assert torch.equal(run(agg, W0, opposite, SAMPLES[:2], IDS[:2]).params, W0)
    res = run(agg, W0, ROUND1, r=2)
    w1 = res.params
    # from W0 again, where +-1 cancels exactly in float32 (the momentum lives in the aggregator)
    res = run(agg, W0, opposite, SAMPLES[:2], IDS[:2], r=3)
    w2 = res.params
    assert torch.allclose(w2 - W0, 0.5 * (w1 - W0))


@pytest.mark.parametrize("make", [FedNNNN, NormNorm, FedMomentum])
def test_numerically_safe_cases(make):
    assert torch.equal(run(make(), W0, W0.repeat(3, 1)).params, W0)  # zero updates
    make_res = run(make(), W0, ROUND1[:1].repeat(3, 1))  # identical clients: N = E
    same = make_res.params
    make_res = run(make(), W0, ROUND1[1:2], SAMPLES[1:2], IDS[1:2])  # single client: N = E
    one = make_res.params
    scale = 1.0 if make is FedMomentum else 0.7
    assert torch.allclose(same, W0 + scale * (ROUND1[0] - W0), atol=1e-6)
    assert torch.allclose(one, W0 + scale * (ROUND1[1] - W0), atol=1e-6)


def test_identical_clients_with_beta_one_return_that_client():
    FedNNNN_res = run(FedNNNN(beta=1.0, gamma=0.0), W0, ROUND1[:1].repeat(3, 1))
    out = FedNNNN_res.params
    assert torch.allclose(out, ROUND1[0], atol=1e-6)  # E/N = 1 up to float32 rounding


@pytest.mark.parametrize(
    "make, kwargs, key",
    [(FedNNNN, {"beta": 0}, "beta"), (FedNNNN, {"beta": -0.5}, "beta"), (FedNNNN, {"gamma": 1.0}, "gamma"),
     (FedNNNN, {"gamma": -0.1}, "gamma"), (FedNNNN, {"weighting": "size"}, "weighting"),
     (NormNorm, {"beta": "big"}, "beta"), (FedMomentum, {"gamma": 2}, "gamma")],
)
def test_bad_options_name_the_key(make, kwargs, key):
    with pytest.raises(ValueError, match=rf"aggregator\.{key}="):
        make(**kwargs)


@pytest.mark.parametrize(
    "cls, attrs",
    [(FedNNNN, (0.7, 0.8, "uniform")), (NormNorm, (0.7, 0.0, "uniform")), (FedMomentum, (1.0, 0.8, "uniform"))],
)
def test_defaults_are_specs(cls, attrs):
    agg = cls()
    assert (agg.beta, agg.gamma, agg.weighting) == attrs


def test_keeps_the_papers_evaluation_model_the_plain_average():
    agg = FedNNNN()
    res = run(agg, W0, ROUND1)
    w1 = res.params
    tested = res.tested_params()
    assert torch.allclose(tested, ROUND1.mean(dim=0)) and not torch.allclose(w1, tested)


def test_evaluate_option_picks_the_tested_model():
    w = torch.zeros(2)
    clients = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    ids, n = torch.tensor([0, 1]), torch.tensor([1, 1])
    avg = FedNNNN(beta=1.0, gamma=0.0)
    avg_res = avg.aggregate(RoundInputs.of(w, clients, num_samples=n, client_ids=ids, round=1))
    out = avg_res.params
    assert torch.allclose(avg_res.tested_params(), torch.tensor([0.5, 0.5]))  # the plain average is what gets tested
    assert torch.allclose(out, torch.tensor([0.5, 0.5]) * (1.0 / (0.5**0.5)))  # sent: stretched to E = 1
    glob = FedNNNN(beta=1.0, gamma=0.0, evaluate="global")
    glob_res = glob.aggregate(RoundInputs.of(w, clients, num_samples=n, client_ids=ids, round=1))
    sent = glob_res.params
    assert glob_res.tested_params() is sent
    with pytest.raises(ValueError, match=r"aggregator.evaluate='best'"):
        FedNNNN(evaluate="best")
