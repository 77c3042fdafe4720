"""FedDisco, L-DAWA and FedDyn against numpy references written from SPEC "Baselines"."""

import numpy as np
import pytest
import torch
from hydra.utils import instantiate

from conftest import compose_config
from fedagg import RoundInputs
from fedagg.aggregators.feddisco import FedDisco
from fedagg.aggregators.feddyn import FedDyn, FedDynClient
from fedagg.aggregators.inputs import Needs
from fedagg.aggregators.ldawa import LDAWA
from fedagg.models.flat import ParamLayout

W = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0])
CLIENTS = torch.tensor([[1.5, -0.5, 1.5, 2.0, 1.0], [0.7, -1.3, 2.1, 0.4, 0.8], [-1.0, 0.2, 2.3, -0.6, 2.1]])
IDS = torch.tensor([0, 1, 2])
# label counts of the participants (rows sum to their sizes 8, 4, 4) and of all 4 clients (client 3 holds [2, 2, 2])
HIST = torch.tensor([[6.0, 0.0, 2.0], [1.0, 1.0, 2.0], [0.0, 3.0, 1.0]])
SAMPLES = torch.tensor([8, 4, 4])
GLOBAL_HIST = HIST.sum(0) + torch.tensor([2.0, 2.0, 2.0])
ALL_N = torch.tensor([8, 4, 4, 6, 3])  # five clients in the federation (FedDyn's m = 5)
# two layers: [0:2] and [2:5]
LAYOUT = ParamLayout(("a", "b"), (torch.Size([2]), torch.Size([3])), (0, 2, 5))


def np64(x):
    return x.double().numpy()


def run(agg, w=W, clients=CLIENTS, n=SAMPLES, ids=IDS, r=1, **kw):
    return agg.aggregate(RoundInputs.of(w, clients, num_samples=n, client_ids=ids, round=r, **kw))


# ---------------------------------------------------------------- FedDisco
def disco_reference(hist, glob, n, a=0.5, b=0.1, uniform=False):
    local = hist / hist.sum(1, keepdims=True)
    target = np.full(hist.shape[1], 1.0 / hist.shape[1]) if uniform else glob / glob.sum()
    d = np.sqrt(((local - target) ** 2).sum(1))  # L2, not L1
    D = n / n.sum()
    s = np.maximum(D - a * d + b, 0.0)
    return s / s.sum() if s.sum() > 0 else D


@pytest.mark.parametrize("reference", ["global", "uniform"])
def test_feddisco_weights_and_global_match_hand_computation(reference):
    agg = FedDisco(reference=reference)
    res = run(agg, label_hist=HIST, global_label_hist=GLOBAL_HIST)
    new = res.params
    p = disco_reference(np64(HIST), np64(GLOBAL_HIST), np64(SAMPLES), uniform=reference == "uniform")
    assert np.all(p > 0) and not np.allclose(p, np64(SAMPLES) / 16)  # the discrepancy really moves the weights
    assert np.allclose(res.weights.numpy(), p, atol=1e-6)
    assert np.allclose(new.numpy(), p @ np64(CLIENTS), atol=1e-6)  # new global Σ p_k W_k


def test_feddisco_clips_negative_scores_and_uses_participant_sizes():
    # a = 1: client 2 (farthest from the global distribution) is clipped to 0; round 2 has other participants, D over them
    agg = FedDisco(a=1.0)
    p = disco_reference(np64(HIST), np64(GLOBAL_HIST), np64(SAMPLES), a=1.0)
    res = run(agg, label_hist=HIST, global_label_hist=GLOBAL_HIST)
    assert p[2] == 0 and p[0] > 0 and np.allclose(res.weights.numpy(), p, atol=1e-6)
    assert res.metrics == {"clipped": 1.0}  # one participant lost all its weight
    hist2, n2 = HIST[1:], SAMPLES[1:]  # clients {1, 2}: the same global distribution, D = [1/2, 1/2]
    res = run(agg, clients=CLIENTS[1:], n=n2, ids=IDS[1:], r=2, label_hist=hist2, global_label_hist=GLOBAL_HIST)
    assert np.allclose(res.weights.numpy(), disco_reference(np64(hist2), np64(GLOBAL_HIST), np64(n2), a=1.0), atol=1e-6)


def test_feddisco_all_scores_clipped_falls_back_to_data_sizes():
    agg = FedDisco(a=10.0, b=0.0)
    res = run(agg, label_hist=HIST, global_label_hist=GLOBAL_HIST)
    new = res.params
    assert torch.allclose(res.weights, torch.tensor([0.5, 0.25, 0.25]))
    assert torch.isfinite(new).all()


def test_feddisco_invariants():
    agg = FedDisco()
    res = run(agg, clients=CLIENTS[:1].repeat(3, 1), label_hist=HIST, global_label_hist=GLOBAL_HIST)
    same = res.params
    assert torch.allclose(same, CLIENTS[0], atol=1e-6)
    assert (res.weights >= 0).all() and torch.isclose(res.weights.sum(), torch.tensor(1.0))
    res = run(agg, clients=CLIENTS[1:2], n=SAMPLES[1:2], ids=IDS[1:2], label_hist=HIST[1:2], global_label_hist=GLOBAL_HIST)
    one = res.params
    assert torch.allclose(one, CLIENTS[1], atol=1e-6)
    res = run(agg, clients=W.repeat(3, 1), label_hist=HIST, global_label_hist=GLOBAL_HIST)
    zero = res.params
    assert torch.equal(zero, W)
    assert agg.state_dict() == {} and FedDisco().needs == Needs(label_hist=True)


def test_feddisco_kl_discrepancy_is_normalised_over_participants():
    agg = FedDisco(reference="uniform", discrepancy="kl")
    res = run(agg, label_hist=HIST, global_label_hist=GLOBAL_HIST)
    new = res.params
    local = np64(HIST) / np64(HIST).sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = np.where(local > 0, local * np.log(local * 3.0), 0.0).sum(1)  # KL(local || 1/3)
    d = kl / kl.sum()
    # by hand: client 1 is nearest to uniform, so it has the smallest d and gains weight over its size share
    assert d.argmin() == 1 and np.isclose(d.sum(), 1.0)
    s = np.maximum(np64(SAMPLES) / 16 - 0.5 * d + 0.1, 0.0)
    assert np.allclose(res.weights.numpy(), s / s.sum(), atol=1e-6)
    assert np.allclose(new.numpy(), (s / s.sum()) @ np64(CLIENTS), atol=1e-6)
    assert not np.allclose(s / s.sum(), disco_reference(np64(HIST), np64(GLOBAL_HIST), np64(SAMPLES), uniform=True))


def test_feddisco_kl_with_every_client_matching_the_reference_has_zero_discrepancy():
    agg = FedDisco(reference="uniform", discrepancy="kl")
    flat = torch.tensor([[2.0, 2.0, 2.0], [1.0, 1.0, 1.0], [3.0, 3.0, 3.0]])
    res = run(agg, n=torch.tensor([6, 3, 9]), label_hist=flat, global_label_hist=flat.sum(0))
    D = torch.tensor([6.0, 3.0, 9.0]) / 18
    assert torch.allclose(res.weights, (D + 0.1) / 1.3)  # d = 0 (no 0/0): only b is added to each D_k


def test_feddisco_without_histograms_is_a_clear_error():
    with pytest.raises(ValueError, match="reads inputs.label_hist but does not declare it"):
        run(FedDisco())


@pytest.mark.parametrize("kwargs, key", [({"a": -0.5}, "a"), ({"a": "big"}, "a"), ({"b": float("nan")}, "b"),
                                         ({"b": True}, "b"), ({"reference": "test"}, "reference"),
                                         ({"discrepancy": "l1"}, "discrepancy")])
def test_feddisco_bad_values_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=rf"aggregator\.{key}="):
        FedDisco(**kwargs)


# ---------------------------------------------------------------- L-DAWA
def ldawa_reference(w, clients, slices):
    new, weights = np.empty_like(w), []
    for s in slices:
        Wl, wl = clients[:, s], w[s]
        norms = np.linalg.norm(Wl, axis=1) * np.linalg.norm(wl)
        cos = np.where(norms > 0, Wl @ wl / np.where(norms > 0, norms, 1.0), 0.0)
        c = np.maximum(cos, 0.0)
        p = c / c.sum() if c.sum() > 0 else np.full(len(c), 1.0 / len(c))
        new[s] = p @ Wl
        weights.append(p)
    return new, np.mean(weights, axis=0)


def test_ldawa_per_layer_weights_match_hand_computation_over_two_rounds():
    agg = LDAWA()
    res = run(agg, layout=LAYOUT)
    new1 = res.params
    ref1, p1 = ldawa_reference(np64(W), np64(CLIENTS), LAYOUT.slices)
    cos_a = np64(CLIENTS[:, :2]) @ np64(W[:2])
    assert (cos_a < 0).any() and (cos_a > 0).any()  # layer a clips a client; the test would catch a missing clip
    assert np.allclose(new1.numpy(), ref1, atol=1e-6) and np.allclose(res.weights.numpy(), p1, atol=1e-6)
    # round 2: clients {2, 4} from the new global (no state, but a wrong reference model would show)
    clients2 = new1 + torch.tensor([[0.3, -0.2, 0.5, 0.1, -0.4], [-0.6, 0.9, -0.1, 0.7, 0.2]])
    res = run(agg, w=new1, clients=clients2, n=torch.tensor([4, 3]), ids=torch.tensor([2, 4]), r=2, layout=LAYOUT)
    new2 = res.params
    ref2, p2 = ldawa_reference(np64(new1), np64(clients2), LAYOUT.slices)
    assert np.allclose(new2.numpy(), ref2, atol=1e-6) and np.allclose(res.weights.numpy(), p2, atol=1e-6)


def test_ldawa_layer_without_positive_cosine_is_averaged_uniformly():
    w = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])  # layer b of the global model is all zeros: cos = 0 for everyone
    clients = torch.tensor([[-1.0, 0.5, 1.0, 2.0, 3.0], [-2.0, 1.0, 0.0, 1.0, 0.0], [-0.5, -3.0, 2.0, 0.0, 1.0]])
    LDAWA_res = run(LDAWA(), w=w, clients=clients, layout=LAYOUT)  # layer a: every cosine negative
    new = LDAWA_res.params
    assert torch.allclose(new, clients.mean(0)) and torch.isfinite(new).all()


def test_ldawa_invariants_and_errors():
    agg = LDAWA()
    res = run(agg, clients=CLIENTS[:1].repeat(3, 1), layout=LAYOUT)
    assert torch.allclose(res.params, CLIENTS[0], atol=1e-6)
    assert (res.weights >= 0).all() and torch.isclose(res.weights.sum(), torch.tensor(1.0))
    assert torch.allclose(run(agg, clients=CLIENTS[1:2], n=SAMPLES[1:2], ids=IDS[1:2], layout=LAYOUT).params, CLIENTS[1])
    assert torch.allclose(run(agg, clients=W.repeat(3, 1), layout=LAYOUT).params, W)
    assert torch.isfinite(run(agg, w=torch.zeros(5), clients=torch.zeros(3, 5), layout=LAYOUT).params).all()
    assert agg.state_dict() == {}
    with pytest.raises(ValueError, match="layout covers 4"):
        run(agg, layout=ParamLayout(("a",), (torch.Size([4]),), (0, 4)))


# ---------------------------------------------------------------- FedDyn
def test_feddyn_server_update_over_two_rounds_with_partial_participation():
    alpha, m = 0.1, 5
    agg = FedDyn(alpha=alpha)
    res = run(agg, all_num_samples=ALL_N)
    new1 = res.params
    h1 = np.zeros(5) - alpha / m * (np64(CLIENTS) - np64(W)).sum(0)  # h ← h − α (1/m) Σ_k Δ_k, m = all 5 clients
    assert np.allclose(agg.h.numpy(), h1, atol=1e-7)
    assert res.metrics == {"h_norm": pytest.approx(np.linalg.norm(h1), rel=1e-6)}
    assert np.allclose(new1.numpy(), np64(CLIENTS).mean(0) - h1 / alpha, atol=1e-6)  # w ← mean_k W_k − h/α
    assert torch.allclose(res.weights, torch.full((3,), 1 / 3))
    clients2 = new1 + torch.tensor([[0.3, -0.2, 0.5, 0.1, -0.4], [-0.6, 0.9, -0.1, 0.7, 0.2]])
    res = run(agg, w=new1, clients=clients2, n=torch.tensor([4, 3]), ids=torch.tensor([2, 4]), r=2, all_num_samples=ALL_N)
    new2 = res.params
    h2 = h1 - alpha / m * (np64(clients2) - np64(new1)).sum(0)
    assert np.allclose(new2.numpy(), np64(clients2).mean(0) - h2 / alpha, atol=1e-5)
    assert torch.allclose(res.weights, torch.full((2,), 0.5))


def test_feddyn_state_round_trip_is_bit_identical():
    clients2 = CLIENTS[1:] * 0.9
    a = FedDyn()
    a_res = run(a, all_num_samples=ALL_N)
    state = a.state_dict()
    b = FedDyn()
    b.load_state_dict(state)
    state["h"].add_(1.0)  # the saved state is a copy, not the live tensor
    a_res = run(a, clients=clients2, n=SAMPLES[1:], ids=IDS[1:], r=2, all_num_samples=ALL_N)
    out_a = a_res.params
    b_res = run(b, clients=clients2, n=SAMPLES[1:], ids=IDS[1:], r=2, all_num_samples=ALL_N)
    out_b = b_res.params
    assert torch.equal(out_a, out_b) and torch.equal(a.h, b.h)
    fresh = FedDyn()
    fresh.load_state_dict(FedDyn().state_dict())  # before any round: no h yet
    assert fresh.h is None


def test_feddyn_numerical_safety_and_errors():
    agg = FedDyn()
    assert torch.equal(run(agg, clients=W.repeat(3, 1), all_num_samples=ALL_N).params, W)  # zero updates: h stays 0
    assert torch.isfinite(run(agg, clients=CLIENTS[:1], n=SAMPLES[:1], ids=IDS[:1], all_num_samples=ALL_N).params).all()


@pytest.mark.parametrize("alpha", [0, -0.1, True, "0.01", float("inf")])
def test_feddyn_bad_alpha_names_the_key(alpha):
    with pytest.raises(ValueError, match=r"aggregator\.alpha="):
        FedDyn(alpha=alpha)


def test_feddyn_is_one_method_whose_yaml_shares_alpha_with_its_client_half():
    agg = instantiate(compose_config("aggregator=feddyn", "aggregator.alpha=0.05").aggregator)
    half = agg.needs.client_half
    assert type(half) is FedDynClient and agg.alpha == half.alpha == 0.05
    assert agg.needs == Needs(client_half=half)  # nothing else: its server half needs only the parameters
    with pytest.raises(ValueError, match=r"aggregator.client.alpha=0.1 is not allowed; both halves of FedDyn use "
                                         r"aggregator.alpha=0.01"):
        FedDyn(alpha=0.01, client=FedDynClient(alpha=0.1))
    assert FedDyn(alpha=0.2).needs.client_half.alpha == 0.2  # built by hand, it makes its own client half
