"""FedAWA / FedAWA-L against a numpy reference written from SPEC "FedAWA" (hand-derived gradient, hand-written Adam)."""

import numpy as np
import pytest
import torch

from fedagg import RoundInputs
from fedagg.aggregators.fedawa import FedAWA, FedAWAL
from fedagg.models.flat import ParamLayout

W = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0])
DELTAS = torch.tensor([[1.0, 0.5, -0.5, 2.0, 0.0], [0.2, -0.3, 0.1, 0.4, -0.2], [-1.5, 0.8, 0.3, -0.6, 1.1]])
CLIENTS = W + DELTAS
SAMPLES = torch.tensor([1, 2, 1])
IDS = torch.tensor([0, 1, 2])
ALL_N = torch.tensor([1, 2, 1, 4])  # every client's size by global id; Σ = 8
# round 2: clients {1, 3} from a new global
W2 = torch.tensor([0.4, -0.8, 1.9, 0.3, 1.0])
CLIENTS2 = W2 + torch.tensor([[0.3, -0.2, 0.5, 0.1, -0.4], [-0.6, 0.9, -0.1, 0.7, 0.2]])
IDS2, SAMPLES2 = torch.tensor([1, 3]), torch.tensor([2, 4])
LR, B1, B2, EPS = 1e-3, 0.5, 0.999, 1e-8


def softmax(t):
    e = np.exp(t - t.max())
    return e / e.sum()


def drift(w, Wk, reg):
    if reg == "cos":
        return 1 - Wk @ w / (np.linalg.norm(Wk, axis=1) * np.linalg.norm(w))
    if reg == "euclid":
        return ((Wk - w) ** 2).mean(axis=1)
    return np.zeros(len(Wk))


def loss_and_grad(t, w, Wk, reg):
    """L = Σ λ_k ‖τ_k − τ_g‖ + Σ λ_k d_k, and dL/dT by the chain rule through the softmax."""
    lam, tau, c = softmax(t), Wk - w, drift(w, Wk, reg)
    d = tau - lam @ tau
    s = np.linalg.norm(d, axis=1)
    loss = lam @ (s + c)
    unit = np.divide(d, s[:, None], out=np.zeros_like(d), where=s[:, None] > 0)
    a = s + c - tau @ (lam @ unit)  # dL/dλ_j with λ free: τ_g moves by τ_j
    return loss, lam * (a - lam @ a)  # softmax Jacobian


def adam(t, w, Wk, reg, steps=1, lr=LR, b1=B1, b2=B2):
    m, v = np.zeros_like(t), np.zeros_like(t)
    for i in range(1, steps + 1):
        g = loss_and_grad(t, w, Wk, reg)[1]
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g**2
        t = t - lr * (m / (1 - b1**i)) / (np.sqrt(v / (1 - b2**i)) + EPS)
    return t


def np64(x):
    return x.double().numpy()


def run(agg, w=W, clients=CLIENTS, n=SAMPLES, ids=IDS, r=1, **kw):
    return agg.aggregate(RoundInputs.of(w, clients, num_samples=n, client_ids=ids, round=r, **kw))


def test_reference_gradient_matches_finite_differences():  # guards the test's own derivation
    t = np.array([0.1, 0.3, -0.2])
    for reg in ("cos", "euclid"):
        g = loss_and_grad(t, np64(W), np64(CLIENTS), reg)[1]
        fd = [(loss_and_grad(t + e, np64(W), np64(CLIENTS), reg)[0] - loss_and_grad(t - e, np64(W), np64(CLIENTS), reg)[0]) / 2e-6
              for e in np.eye(3) * 1e-6]
        assert np.allclose(g, fd, atol=1e-7)


@pytest.mark.parametrize("reg", ["cos", "euclid", "none"])
def test_two_rounds_with_partial_participation_match_hand_computation(reg):
    agg = FedAWA(reg=reg)
    t0 = np.array([1, 2, 1]) / 8.0  # n_k / Σ n over ALL clients, not this round's 4
    lam1 = softmax(t0)
    res = run(agg, all_num_samples=ALL_N)
    new1 = res.params
    assert np.allclose(res.weights.numpy(), lam1, atol=1e-7)
    assert np.allclose(new1.numpy(), lam1 @ np64(CLIENTS) / lam1.sum(), atol=1e-6)  # λ from BEFORE the step
    assert res.metrics["loss"] == pytest.approx(loss_and_grad(t0, np64(W), np64(CLIENTS), reg)[0], rel=1e-5)
    t1 = adam(t0, np64(W), np64(CLIENTS), reg)
    assert np.allclose(np.abs(t1 - t0), LR, rtol=1e-4)  # the first Adam step moves each logit by ≈ lr
    assert np.allclose([agg.logits[i].item() for i in range(3)], t1, atol=1e-7)
    # round 2: client 1 keeps its learned logit, client 3 starts at 4/8
    t_s = np.array([t1[1], 4 / 8.0])
    lam2 = softmax(t_s)
    res = run(agg, W2, CLIENTS2, SAMPLES2, IDS2, r=2, all_num_samples=ALL_N)
    new2 = res.params
    assert np.allclose(res.weights.numpy(), lam2, atol=1e-7)
    assert np.allclose(new2.numpy(), lam2 @ np64(CLIENTS2) / lam2.sum(), atol=1e-6)
    t2 = adam(t_s, np64(W2), np64(CLIENTS2), reg)
    assert np.allclose([agg.logits[1].item(), agg.logits[3].item()], t2, atol=1e-7)
    assert np.allclose([agg.logits[0].item(), agg.logits[2].item()], t1[[0, 2]], atol=1e-7)  # absent: untouched


def test_without_all_sizes_falls_back_to_this_rounds_fractions():
    agg = FedAWA()
    res = run(agg, W2, CLIENTS2, SAMPLES2, IDS2)
    t0 = np.array([2, 4]) / 6.0
    assert np.allclose(res.weights.numpy(), softmax(t0), atol=1e-7)


@pytest.mark.parametrize("betas", [(0.5, 0.999), (0.9, 0.99)])
def test_several_steps_and_use_updated(betas):
    # a large lr makes the gradient change between steps, so β1, β2 and the bias correction matter
    agg = FedAWA(server_lr=0.3, betas=betas, server_steps=3, use_updated=True)
    res = run(agg, all_num_samples=ALL_N)
    new = res.params
    t3 = adam(np.array([1, 2, 1]) / 8.0, np64(W), np64(CLIENTS), "cos", steps=3, lr=0.3, b1=betas[0], b2=betas[1])
    lam = softmax(t3)  # recomputed after the steps
    assert np.allclose([agg.logits[i].item() for i in range(3)], t3, atol=1e-6)
    assert np.allclose(res.weights.numpy(), lam, atol=1e-6)
    assert np.allclose(new.numpy(), lam @ np64(CLIENTS), atol=1e-5)
    FedAWA_res = run(FedAWA(server_lr=0.3, betas=betas, server_steps=3), all_num_samples=ALL_N)
    before = FedAWA_res.params
    assert not torch.allclose(new, before, atol=1e-3)


def sgd(t, w, Wk, reg, steps, lr, momentum, weight_decay):
    """torch.optim.SGD's update written out: the decay joins the gradient, the buffer starts at it."""
    buf = None
    for _ in range(steps):
        g = loss_and_grad(t, w, Wk, reg)[1] + weight_decay * t
        buf = g if buf is None else momentum * buf + g
        t = t - lr * buf
    return t


@pytest.mark.parametrize("steps", [1, 3])
def test_sgd_server_optimizer_matches_hand_computation(steps):
    agg = FedAWA(server_optimizer="sgd", server_steps=steps, server_lr=0.5, use_updated=True)
    assert FedAWA(server_optimizer="sgd").server_lr == 1e-2  # the authors' code's SGD learning rate
    res = run(agg, all_num_samples=ALL_N)
    new = res.params
    t = sgd(np.array([1, 2, 1]) / 8.0, np64(W), np64(CLIENTS), "cos", steps, lr=0.5, momentum=0.9, weight_decay=5e-4)
    assert np.allclose([agg.logits[i].item() for i in range(3)], t, atol=1e-6)
    assert np.allclose(new.numpy(), softmax(t) @ np64(CLIENTS), atol=1e-5)


def test_gamma_scales_the_new_global_and_nothing_else():
    plain, scaled = FedAWA(), FedAWA(gamma=0.9)
    plain_res, scaled_res = run(plain, all_num_samples=ALL_N), run(scaled, all_num_samples=ALL_N)
    a, b = plain_res.params, scaled_res.params
    lam = softmax(np.array([1, 2, 1]) / 8.0)
    assert np.allclose(b.numpy(), 0.9 * (lam @ np64(CLIENTS)), atol=1e-6)
    assert torch.allclose(b, 0.9 * a, atol=1e-7) and torch.equal(plain_res.weights, scaled_res.weights)
    assert all(torch.equal(plain.logits[i], scaled.logits[i]) for i in range(3))
    # the BatchNorm statistics scale too
    assert np.allclose(scaled_res.weights_for_buffers().numpy(), 0.9 * lam, atol=1e-7)
    assert torch.equal(plain_res.weights_for_buffers(), plain_res.weights)


def test_state_round_trip_is_bit_identical():
    a = FedAWAL()
    layout = two_layer_layout()
    a_res = run(a, all_num_samples=ALL_N, layout=layout)
    state = a.state_dict()
    b = FedAWAL()
    b.load_state_dict(state)
    state["logits"][1].add_(1.0)  # the saved copy is independent of the live state
    a_res = run(a, W2, CLIENTS2, SAMPLES2, IDS2, r=2, all_num_samples=ALL_N, layout=layout)
    out_a = a_res.params
    b_res = run(b, W2, CLIENTS2, SAMPLES2, IDS2, r=2, all_num_samples=ALL_N, layout=layout)
    out_b = b_res.params
    assert torch.equal(out_a, out_b) and torch.equal(a_res.weights, b_res.weights)
    assert all(torch.equal(a.logits[i], b.logits[i]) for i in (0, 1, 2, 3))


def test_identical_clients_zero_updates_and_single_client_are_safe():
    same = CLIENTS[:1].repeat(3, 1)
    for agg in (FedAWA(), FedAWAL()):
        res = run(agg, clients=same, layout=two_layer_layout())
        out = res.params
        assert torch.allclose(out, CLIENTS[0], atol=1e-6)
        assert (res.weights >= 0).all() and res.weights.sum() == pytest.approx(1.0)
        assert all(torch.isfinite(t).all() for t in agg.logits.values())
        zero = W.repeat(3, 1)
        assert torch.allclose(run(agg, clients=zero, r=2, layout=two_layer_layout()).params, W, atol=1e-6)
        res = run(agg, clients=CLIENTS[1:2], n=SAMPLES[1:2], ids=torch.tensor([7]), r=3, layout=two_layer_layout())
        one = res.params
        assert torch.equal(one, CLIENTS[1]) and torch.equal(res.weights, torch.ones(1))
    zero_global = torch.zeros(5)  # cos with an all-zero global model (guarded)
    assert torch.isfinite(run(FedAWA(), w=zero_global).params).all()


def two_layer_layout():
    return ParamLayout(names=("a", "b"), shapes=(torch.Size([2]), torch.Size([3])), offsets=(0, 2, 5))


def test_layerwise_weights_follow_each_layer():
    # layer a: client 0 is the outlier; layer b: client 2 is
    deltas = torch.tensor([[3.0, -2.0, 0.1, 0.2, 0.0], [0.1, 0.1, 0.2, 0.1, 0.1], [0.2, 0.0, -2.0, 3.0, 1.5]])
    clients, agg, layout = W + deltas, FedAWAL(), two_layer_layout()
    t0 = np.array([1, 2, 1]) / 8.0
    res = run(agg, clients=clients, all_num_samples=ALL_N, layout=layout)
    new1 = res.params
    assert np.allclose(new1.numpy(), softmax(t0) @ np64(clients), atol=1e-6)
    # the loss is a sum over layers of independent terms, so each layer's logits take FedAWA's step on its slice
    ta = adam(t0, np64(W)[:2], np64(clients)[:, :2], "cos")
    tb = adam(t0, np64(W)[2:], np64(clients)[:, 2:], "cos")
    assert np.allclose(torch.stack([agg.logits[i] for i in range(3)]).numpy(), np.stack([ta, tb], axis=1), atol=1e-7)
    assert ta[0] < t0[0] and tb[2] < t0[2]  # each layer's outlier loses weight in that layer
    res = run(agg, W, clients, SAMPLES, IDS, r=2, all_num_samples=ALL_N, layout=layout)
    new2 = res.params
    la, lb = softmax(ta), softmax(tb)
    assert not np.allclose(la, lb, atol=1e-5)
    expected = np.concatenate([la @ np64(clients)[:, :2], lb @ np64(clients)[:, 2:]])
    assert np.allclose(new2.numpy(), expected, atol=1e-6)
    assert np.allclose(res.weights.numpy(), (la + lb) / 2, atol=1e-7)


def test_one_layer_fedawa_l_is_fedawa():
    whole = ParamLayout(names=("w",), shapes=(torch.Size([5]),), offsets=(0, 5))
    a, b = FedAWA(), FedAWAL()
    assert torch.equal(run(a, all_num_samples=ALL_N).params, run(b, all_num_samples=ALL_N, layout=whole).params)
    assert torch.equal(a.logits[2], b.logits[2])


def test_fedawa_l_with_a_layout_of_another_model_says_so():
    with pytest.raises(ValueError, match="the layout covers 4 parameters but the vectors have 5"):
        run(FedAWAL(), layout=ParamLayout(("a",), (torch.Size([4]),), (0, 4)))


@pytest.mark.parametrize("key, value, hint", [
    ("reg", "l1", "cos, euclid, none"), ("server_lr", 0.0, "> 0"), ("betas", (1.0, 0.999), r"\[0, 1\)"),
    ("betas", (0.5,), "two numbers"), ("server_steps", 0, ">= 1"), ("use_updated", "yes", "true or false"),
    ("server_optimizer", "rmsprop", "adam, sgd"), ("gamma", 0.0, "> 0"), ("momentum", -0.1, ">= 0"),
    ("weight_decay", float("nan"), ">= 0"),
])
def test_bad_values_name_the_key(key, value, hint):
    with pytest.raises(ValueError, match=rf"aggregator\.{key}=.*{hint}"):
        FedAWA(**{key: value})


@pytest.mark.parametrize("cls", [FedAWA, FedAWAL])
def test_defaults_are_specs(cls):
    agg = cls()
    assert agg.betas == (0.5, 0.999) and agg.server_lr == 1e-3
    assert agg.server_steps == 1 and agg.reg == "cos" and agg.use_updated is False
    assert agg.server_optimizer == "adam" and agg.gamma == 1.0
    assert agg.state_dict() == {"logits": {}}
