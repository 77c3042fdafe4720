"""SCAFFOLD, FedNova and FedExP against closed forms and numpy transcriptions of SPEC "Drift correction"."""

import csv
import json

import numpy as np
import pytest
import torch

from conftest import compose_config
from fedagg import RoundInputs
from fedagg.aggregators.base import FedAvg
from fedagg.aggregators.fedexp import FedExP
from fedagg.aggregators.inputs import ClientSetup
from fedagg.aggregators.fednova import FedNova, normaliser
from fedagg.aggregators.scaffold import Scaffold, ScaffoldClient
from fedagg.clients.objectives import LocalWork
from fedagg.clients.stacked_sgd import StackedSGD
from fedagg.clients.trainer import LocalSolver
from fedagg.run import train

PLAIN = LocalSolver(momentum=0.0, nesterov=False, weight_decay=0.0, proximal_mu=0.0, keeps_momentum=False)


def np64(x):
    return x.double().numpy()


# ---------------------------------------------------------------- SCAFFOLD
def local_steps_on_quadratic(half: ScaffoldClient, client_id: int, w: torch.Tensor, b: torch.Tensor, steps: int,
                             lr: float, momentum: float = 0.0) -> torch.Tensor:
    """SGD on 1/2 ||theta - b||^2 plus the client half's term, through the trainer's StackedSGD."""
    theta = w.clone().unsqueeze(0)
    sgd = StackedSGD([theta], lr=lr, momentum=momentum, nesterov=False, weight_decay=0.0, saved=[None])
    state = [half.client_state(client_id, w)]
    for _ in range(steps):
        leaf = theta[0].clone().requires_grad_(True)
        loss = 0.5 * ((leaf - b) ** 2).sum() + half.penalty([leaf], [w], state)
        grad, = torch.autograd.grad(loss, [leaf])
        sgd.step([grad.unsqueeze(0)], slice(0, 1))
    return theta[0]


def test_scaffold_corrected_local_steps_and_variate_have_the_closed_form():
    w, b = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([3.0, 1.0, -1.0])
    half = ScaffoldClient()
    half.c = torch.tensor([0.2, -0.1, 0.4])
    half.variates[7] = torch.tensor([-0.3, 0.5, 0.1])
    eta, tau = 0.1, 6
    theta = local_steps_on_quadratic(half, 7, w, b, tau, eta)
    # gradient theta - b + (c - c_k): a quadratic around b' = b - (c - c_k), contracted by (1 - eta) a step
    b_shift = np64(b) - (np64(half.c) - np64(half.variates[7]))
    expected = b_shift + (1 - eta) ** tau * (np64(w) - b_shift)
    assert np.allclose(theta.double().numpy(), expected, atol=1e-6)
    old_ck = half.variates[7].clone()
    sent = half.after_training(7, theta, w, LocalWork(steps=tau, lr=eta))
    ck_new = np64(old_ck) - np64(half.c) + (np64(w) - theta.double().numpy()) / (tau * eta)  # option II
    assert np.allclose(half.variates[7].double().numpy(), ck_new, atol=1e-5)
    assert np.allclose(sent["delta_c"].double().numpy(), ck_new - np64(old_ck), atol=1e-5)


def test_scaffold_correction_enters_the_gradient_before_momentum():
    w, b = torch.zeros(2), torch.tensor([1.0, -1.0])
    half = ScaffoldClient()
    half.c = torch.tensor([0.5, 0.5])  # c_k = 0 for a client never seen
    theta = local_steps_on_quadratic(half, 0, w, b, steps=3, lr=0.1, momentum=0.9)
    ref, buf = np64(w), None
    for _ in range(3):  # heavy ball on the corrected gradient: buf = 0.9 buf + g, theta -= 0.1 buf
        g = ref - np64(b) + np64(half.c)
        buf = g if buf is None else 0.9 * buf + g
        ref = ref - 0.1 * buf
    assert np.allclose(theta.double().numpy(), ref, atol=1e-6)


def test_scaffold_two_rounds_with_partial_participation_and_unequal_steps():
    torch.manual_seed(0)
    n_total, p = 5, 4
    agg = Scaffold(lr=1.5)
    half = agg.needs.client_half
    w = torch.randn(p)
    c_ref, ck_ref = np.zeros(p), {}
    for ids, steps, lr in (([0, 2, 3], [4, 2, 6], 0.1), ([3, 1], [5, 3], 0.05)):
        trained = w + 0.3 * torch.randn(len(ids), p)
        sent = [half.after_training(i, row, w, LocalWork(s, lr)) for i, row, s in zip(ids, trained, steps)]
        inputs = RoundInputs.of(w, trained, client_ids=torch.tensor(ids), all_num_samples=torch.ones(n_total),
                                payloads={"delta_c": torch.stack([x["delta_c"] for x in sent])})
        res = agg.aggregate(inputs)
        new = res.params
        deltas = []
        for i, row, s in zip(ids, trained, steps):  # the reference, by client id
            old = ck_ref.get(i, np.zeros(p))
            ck_ref[i] = old - c_ref + (np64(w) - np64(row)) / (s * lr)
            deltas.append(ck_ref[i] - old)
        c_ref = c_ref + np.sum(deltas, axis=0) / n_total  # 1/N over all five clients
        expected = np64(w) + 1.5 * (np64(trained) - np64(w)).mean(axis=0)  # uniform p, eta_g = 1.5
        assert np.allclose(new.double().numpy(), expected, atol=1e-5)
        assert np.allclose(half.c.double().numpy(), c_ref, atol=1e-5)
        assert torch.allclose(res.weights, torch.full((len(ids),), 1 / len(ids)))
        w = new
    assert set(half.variates) == {0, 1, 2, 3}
    assert all(np.allclose(half.variates[i].double().numpy(), ck_ref[i], atol=1e-5) for i in ck_ref)
    # c is the mean over all N clients of their c_k, as it must be when both start at 0
    assert np.allclose(np64(half.c), sum(ck_ref.values()) / n_total, atol=1e-5)


def test_scaffold_state_reaches_both_halves_after_a_load():
    agg = Scaffold()
    agg.load_state_dict({"c": torch.tensor([1.0, 2.0])})
    assert torch.equal(agg.needs.client_half.client_state(3, torch.zeros(2)), torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"aggregator.lr=0 is not allowed"):
        Scaffold(lr=0)


# ---------------------------------------------------------------- FedNova
@pytest.mark.parametrize("tau", [1, 4, 9])
def test_fednova_normalisers_match_their_series(tau):
    steps = torch.tensor([tau])
    assert float(normaliser(steps, 0.1, PLAIN)) == tau
    rho = 0.9  # momentum: a step's gradient keeps acting with weights 1, rho, rho^2, ... until the round ends
    series = sum(sum(rho**s for s in range(t + 1)) for t in range(tau))
    assert float(normaliser(steps, 0.1, LocalSolver(rho, False, 0.0, 0.0, False))) == pytest.approx(series)
    eta, mu = 0.1, 0.5  # proximal: each step shrinks the earlier ones by (1 - eta mu)
    series = sum((1 - eta * mu) ** t for t in range(tau))
    assert float(normaliser(steps, eta, LocalSolver(0.0, False, 0.0, mu, False))) == pytest.approx(series)


W = torch.tensor([0.5, -1.0, 2.0, 0.0])
CLIENTS = torch.tensor([[1.5, -0.5, 2.0, 0.4], [0.0, -2.0, 3.0, 0.2], [0.4, 0.5, 1.0, -0.6]])
SAMPLES = torch.tensor([10, 30, 20])


def fednova_inputs(steps, solver=PLAIN, lr=0.05):
    return RoundInputs.of(W, CLIENTS, num_samples=SAMPLES, local_steps=torch.tensor(steps), local_lr=lr,
                          local_solver=solver)


@pytest.mark.parametrize("solver", [PLAIN, LocalSolver(0.9, False, 0.0, 0.0, False), LocalSolver(0.0, False, 0.0, 0.1, False)])
def test_fednova_server_step_matches_hand_computation(solver):
    steps, lr = [2, 5, 3], 0.05
    agg = FedNova()
    res = agg.aggregate(fednova_inputs(steps, solver, lr))
    new = res.params
    tau = np.array(steps, np.float64)
    rho, mu = solver.momentum, solver.proximal_mu
    a = (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho) if rho else ((1 - (1 - lr * mu) ** tau) / (lr * mu) if mu else tau)
    p = np64(SAMPLES) / 60
    tau_eff = p @ a
    expected = np64(W) + tau_eff * (p / a) @ (np64(CLIENTS) - np64(W))  # w + tau_eff sum_k p_k Delta_k / a_k
    assert np.allclose(new.double().numpy(), expected, atol=1e-6)
    q = p * tau_eff / a
    assert np.allclose(res.weights.double().numpy(), q / q.sum(), atol=1e-6)
    assert res.metrics == pytest.approx({"tau_eff": tau_eff, "step_scale": q.sum()}, rel=1e-6)
    assert not np.allclose(q / q.sum(), p)  # the longer client really counts less


def test_fednova_with_equal_steps_and_plain_sgd_is_fedavg_exactly():
    nova, avg = FedNova(), FedAvg()
    nova_res, avg_res = nova.aggregate(fednova_inputs([4, 4, 4])), avg.aggregate(RoundInputs.of(W, CLIENTS, num_samples=SAMPLES))
    assert torch.equal(nova_res.params, avg_res.params)
    torch.testing.assert_close(nova_res.weights, avg_res.weights)


@pytest.mark.parametrize("solver, key", [
    (LocalSolver(0.9, True, 0.0, 0.0, False), r"client.nesterov=true is not allowed with aggregator=fednova"),
    (LocalSolver(0.9, False, 0.0, 0.01, False), r"client.momentum=0.9 is not allowed with aggregator=fednova: a_k has"),
    (LocalSolver(0.9, False, 0.0, 0.0, True), r"client.keep_optimizer_state=true is not allowed with aggregator=fednova"),
])
def test_fednova_refuses_solvers_without_a_formula(solver, key):
    with pytest.raises(ValueError, match=key):
        FedNova().check_clients(ClientSetup(solver, 10, 10))


def test_fednova_accepts_weight_decay_which_is_part_of_the_local_objective():
    FedNova().check_clients(ClientSetup(LocalSolver(0.9, False, 5e-4, 0.0, False), 10, 10))


# ---------------------------------------------------------------- FedExP
def test_fedexp_extrapolates_when_updates_disagree():
    w = torch.tensor([1.0, 1.0, 1.0])
    agg = FedExP()
    res = agg.aggregate(RoundInputs.of(w, w + torch.eye(3)))
    new = res.params
    # three orthogonal unit updates: ||mean||^2 = 1/3, sum of ||Delta_k||^2 = 3, K = 3
    eta = 3 / (2 * 3 * (1 / 3 + 1e-3))
    assert eta > 1.49 and res.metrics == {"server_lr": pytest.approx(eta)}
    assert torch.allclose(new, w + eta * torch.full((3,), 1 / 3))
    assert torch.equal(res.tested_params(), new)  # round 1: nothing earlier to average with (the code)
    assert torch.allclose(res.weights, torch.full((3,), 1 / 3))
    res = agg.aggregate(RoundInputs.of(new, new + torch.eye(3), round=2))
    later = res.params
    assert torch.allclose(res.tested_params(), (new + later) / 2)  # the mean of the last two global models


def test_fedexp_never_steps_less_than_fedavg():
    w = torch.zeros(3)
    agg = FedExP(evaluate="global")
    same = torch.tensor([[0.3, -0.2, 0.1]] * 4)  # agreeing clients: the ratio is about 1/2, clipped to 1
    res = agg.aggregate(RoundInputs.of(w, same))
    new = res.params
    assert res.metrics == {"server_lr": 1.0} and torch.allclose(new, same[0])
    assert res.tested_params() is new
    with pytest.raises(ValueError, match=r"aggregator.evaluate='best' is not allowed"):
        FedExP(evaluate="best")
    with pytest.raises(ValueError, match=r"aggregator.eps=0 is not allowed"):
        FedExP(eps=0)


def test_fedexp_eps_decays_by_its_factor_every_round_from_round_one():
    w = torch.tensor([1.0, 1.0, 1.0])
    # ||mean||^2 = 1/3, sum ||Delta_k||^2 / (2K) = 1/2, so eta = 1/2 / (1/3 + eps_r)
    # eps = 1/3, decay 1/2: round 2 uses eps / 4 = 1/12, eta = 1/2 / (5/12) = 1.2 (no decay: 0.75, clipped to 1;
    # a decay that starts one round late, eps / 2 = 1/6: eta = 1.0)
    agg = FedExP(eps=1 / 3, eps_decay=0.5, evaluate="global")
    res = agg.aggregate(RoundInputs.of(w, w + torch.eye(3), round=2))
    new = res.params
    assert res.metrics["server_lr"] == pytest.approx(1.2, rel=1e-6)
    torch.testing.assert_close(new, w + 0.4)
    assert FedExP(eps=1 / 3).eps_decay == 1.0  # the default keeps a fixed eps (SPEC)


def test_fedexp_eps_per_client_adds_k_eps_as_the_authors_code_does():
    w = torch.tensor([1.0, 1.0, 1.0])
    # K = 3, eps = 1/36: denominator 1/3 + 3/36 = 5/12, eta = 1/2 / (5/12) = 1.2 (SPEC's 1/3 + 1/36: 18/13)
    agg = FedExP(eps=1 / 36, eps_per_client=True)
    res = agg.aggregate(RoundInputs.of(w, w + torch.eye(3)))
    assert res.metrics["server_lr"] == pytest.approx(1.2, rel=1e-6)
    spec = FedExP(eps=1 / 36)
    assert spec.aggregate(RoundInputs.of(w, w + torch.eye(3))).metrics["server_lr"] == pytest.approx(18 / 13, rel=1e-6)


def test_fedexp_weighting_by_samples_weights_the_mean_and_the_norms():
    w = torch.tensor([0.5, -1.0])
    clients = w + torch.tensor([[4.0, 0.0], [-1.0, 1.0]])
    # p = (1/4, 3/4): mean update (0.25, 0.75), ||.||^2 = 0.625; sum p_k ||Delta_k||^2 = 16/4 + 2 * 3/4 = 5.5;
    # eps = 0.0625: eta = 5.5 / (2 (0.625 + 0.0625)) = 4, so w + 4 (0.25, 0.75) = w + (1, 3)
    # (uniform: 18 / (4 * 2.5625) = 1.756; weighted mean with unweighted norms: 9 / 1.375 = 6.55)
    agg = FedExP(eps=0.0625, weighting="samples")
    res = agg.aggregate(RoundInputs.of(w, clients, num_samples=torch.tensor([1, 3])))
    new = res.params
    assert res.metrics["server_lr"] == pytest.approx(4.0, rel=1e-6)
    torch.testing.assert_close(new, w + torch.tensor([1.0, 3.0]))
    torch.testing.assert_close(res.weights, torch.tensor([0.25, 0.75]))


def test_fedexp_with_every_code_reading_is_the_authors_step():
    g = torch.Generator().manual_seed(4)
    w, deltas, n = torch.randn(20, generator=g), torch.randn(8, 20, generator=g), torch.tensor([5, 1, 9, 3, 4, 7, 2, 6])
    eps_code, decay, r = 0.1, 0.998**2, 3
    agg = FedExP(eps=eps_code, eps_decay=decay, eps_per_client=True, weighting="samples")
    res = agg.aggregate(RoundInputs.of(w, w + deltas, num_samples=n, round=r))
    new = res.params
    # main.py: p_i by data share, grad_avg = sum p_i Delta_i / sum p_i, grad_norm_avg the same mean of ||Delta_i||^2,
    # eta = max(1, 0.5 grad_norm_avg / (||grad_avg||^2 + S eps)), eps multiplied by 0.998^2 before every round
    p = n.double() / n.sum()
    d = deltas.double()
    mean, norm_avg = p @ d, p @ d.pow(2).sum(dim=1)
    eta = max(1.0, float(0.5 * norm_avg / (mean.pow(2).sum() + 8 * eps_code * decay**r)))
    assert res.metrics["server_lr"] == pytest.approx(eta, rel=1e-5) and eta > 1
    torch.testing.assert_close(new.double(), w.double() + eta * mean, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    (dict(eps_decay=0), r"^aggregator.eps_decay=0 is not allowed; use a number in \(0, 1\]"),
    (dict(eps_decay=1.5), r"^aggregator.eps_decay=1.5 is not allowed"),
    (dict(eps_per_client="yes"), r"^aggregator.eps_per_client='yes' is not allowed; it must be true or false$"),
    (dict(weighting="data"), r"^aggregator.weighting='data' is not allowed; choose one of samples, uniform$"),
])
def test_fedexp_refuses_bad_options_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FedExP(**kwargs)


# FedNova, the authors' code's readings: W, CLIENTS[:2] - W as updates below are (1, 0, 2) and (0, 2, -1)
NOVA_W = torch.tensor([0.5, -1.0, 2.0])
NOVA_DELTAS = torch.tensor([[1.0, 0.0, 2.0], [0.0, 2.0, -1.0]])


def test_fednova_tau_eff_from_steps_with_a_proximal_term():
    proximal = LocalSolver(0.0, False, 0.0, 1.0, False)  # mu = 1 at local lr 0.5: eta mu = 1/2
    inputs = RoundInputs.of(NOVA_W, NOVA_W + NOVA_DELTAS, num_samples=torch.tensor([1, 3]),
                            local_steps=torch.tensor([1, 2]), local_lr=0.5, local_solver=proximal)
    # a_k = (1 - (1/2)^tau) / (1/2): 1 and 1.5; p = (1/4, 3/4)
    # the code: tau_eff = 1/4 * 1 + 3/4 * 2 = 1.75, q = p tau_eff / a = (0.4375, 0.875),
    #   update = 0.4375 (1, 0, 2) + 0.875 (0, 2, -1) = (0.4375, 1.75, 0)
    # SPEC: tau_eff = 1/4 * 1 + 3/4 * 1.5 = 1.375, q = (0.34375, 0.6875), update (0.34375, 1.375, 0)
    code, spec = FedNova(tau_eff="steps"), FedNova()
    code_res = code.aggregate(inputs)
    torch.testing.assert_close(code_res.params, NOVA_W + torch.tensor([0.4375, 1.75, 0.0]))
    assert code_res.metrics == pytest.approx({"tau_eff": 1.75, "step_scale": 1.3125})
    torch.testing.assert_close(code_res.weights, torch.tensor([1 / 3, 2 / 3]))
    spec_res = spec.aggregate(inputs)
    torch.testing.assert_close(spec_res.params, NOVA_W + torch.tensor([0.34375, 1.375, 0.0]))
    assert spec_res.metrics["tau_eff"] == pytest.approx(1.375)


def test_fednova_tau_eff_from_steps_changes_nothing_without_a_proximal_term():
    momentum = LocalSolver(0.9, False, 0.0, 0.0, False)  # the code's tau_eff is sum p_k a_k here as well
    inputs = fednova_inputs([2, 5, 3], momentum)
    assert torch.equal(FedNova(tau_eff="steps").aggregate(inputs).params, FedNova().aggregate(inputs).params)  # one code path


def nova_round(agg, w, deltas, lr, r):
    return agg.aggregate(RoundInputs.of(w, w + deltas, num_samples=torch.tensor([1, 1]), local_steps=torch.tensor([2, 2]),
                                        local_lr=lr, local_solver=PLAIN, round=r))


def test_fednova_server_momentum_follows_the_codes_buffer():
    # equal steps, plain SGD, p = (1/2, 1/2): the normalised update U is the plain mean
    # round 1, lr 0.1: U1 = (0.5, 1, 0.5), v1 = U1 / 0.1 = (5, 10, 5), w1 = w0 + 0.1 v1 = (0.5, 1, 0.5)
    # round 2, lr 0.2: U2 = (1, 0, 1), v2 = 0.5 v1 + U2 / 0.2 = (7.5, 5, 7.5), w2 = w1 + 0.2 v2 = (2, 2, 2)
    # (momentum in parameter units, m2 = 0.5 U1 + U2, would give (1.75, 1.5, 1.75); gmf = 0: (1.5, 1, 1.5))
    w0, second = torch.zeros(3), torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 2.0]])
    agg = FedNova(gmf=0.5)
    res = nova_round(agg, w0, NOVA_DELTAS, 0.1, 1)
    w1 = res.params
    torch.testing.assert_close(w1, torch.tensor([0.5, 1.0, 0.5]))
    state = agg.state_dict()
    res = nova_round(agg, w1, second, 0.2, 2)
    w2 = res.params
    torch.testing.assert_close(w2, torch.tensor([2.0, 2.0, 2.0]))
    resumed = FedNova(gmf=0.5)
    resumed.load_state_dict(state)
    assert torch.equal(nova_round(resumed, w1, second, 0.2, 2).params, w2)  # the buffer survives a checkpoint
    plain = FedNova()
    torch.testing.assert_close(nova_round(plain, w1, second, 0.2, 2).params, torch.tensor([1.5, 1.0, 1.5]))
    assert plain.state_dict() == {}


@pytest.mark.parametrize("kwargs, message", [
    (dict(tau_eff="mean"), r"^aggregator.tau_eff='mean' is not allowed; choose one of a, steps"),
    (dict(gmf=1.0), r"^aggregator.gmf=1.0 is not allowed; use a number in \[0, 1\)"),
    (dict(gmf=True), r"^aggregator.gmf=true is not allowed"),
])
def test_fednova_refuses_bad_options_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FedNova(**kwargs)


# ---------------------------------------------------------------- in the round loop
def test_scaffold_in_a_run_keeps_c_the_mean_of_every_clients_variate(tmp_path):
    train(compose_config("rounds=3", "device=cpu", "clients_per_round=4", "aggregator=scaffold",
                         "checkpoint_every=0"), tmp_path)
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    variates = ckpt["trainer"]["objective"]["variates"]["inline"]  # a small run's store: all in the checkpoint
    trained = {int(r["client"]) for r in csv.DictReader(open(tmp_path / "weights.csv"))}
    assert set(variates) == trained and len(trained) > 4  # partial participation: several clients over 3 rounds
    c = ckpt["aggregator"]["c"]
    # c starts at 0 and moves by (1/N) sum of the variates' changes, so it is their mean over all N = 10 clients
    torch.testing.assert_close(c, sum(variates.values()) / 10, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("overrides, message", [
    ("client.momentum=0.9 client.nesterov=true", r"^client.nesterov=true is not allowed with aggregator=fednova"),
    ("client.momentum=0.9 client/objective=fedprox", r"^client.momentum=0.9 is not allowed with aggregator=fednova"),
    ("client.momentum=0.9 client.keep_optimizer_state=true", r"^client.keep_optimizer_state=true is not allowed"),
])
def test_fednova_refuses_local_solvers_without_a_formula_before_training(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message) as info:
        train(compose_config("rounds=1", "device=cpu", "aggregator=fednova", *overrides.split()), tmp_path)
    assert type(info.value).__name__ == "SetupError" and not (tmp_path / "metrics.csv").exists()


def test_fednova_with_the_proximal_objective_runs_with_its_a_k(tmp_path):
    summary = train(compose_config("rounds=2", "device=cpu", "aggregator=fednova", "client/objective=fedprox",
                                   "client.objective.mu=0.1"), tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert summary["status"] == "completed"
    # all clients take 2 epochs of ceil(n / 32) steps; with mu > 0 each a_k < tau_k, so tau_eff < the mean tau
    sizes = [c["size"] for c in json.loads((tmp_path / "partition.json").read_text())["clients"]]
    mean_tau = sum(n * 2 * -(-n // 32) for n in sizes) / sum(sizes)
    assert 0 < float(rows[0]["agg_tau_eff"]) < mean_tau
