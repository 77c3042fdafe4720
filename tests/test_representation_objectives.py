"""MOON, FedLC, FedNTD and FedDecorr: each loss against a transcription of its authors' code on fixed tensors,
a value by hand, and the options SPEC names; the YAMLs, their display names and the refusals."""

import math

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from torch import nn

from conftest import compose_config
from fedagg.clients.feddecorr import FedDecorr
from fedagg.clients.fedlc import FedLC
from fedagg.clients.fedntd import FedNTD, not_true
from fedagg.clients.moon import MOON
from fedagg.clients.objectives import Seen
from fedagg.models.base import Representation

G = torch.Generator().manual_seed(7)
B, D, C = 6, 5, 4
Z, ZG, ZP = (torch.randn(B, D, generator=G) for _ in range(3))
LOGITS, GLOBAL_LOGITS = torch.randn(B, C, generator=G), torch.randn(B, C, generator=G)
Y = torch.tensor([0, 3, 1, 1, 2, 0])


# -- MOON ------------------------------------------------------------------------------------------
def moon_authors(pro1, pro2, pro3, temperature, mu):
    """QinbinLi/MOON@8fcba3c main.py:279-311 (train_net_fedcon), one previous net: cosine of the local projection
    with the global one (positive) and the previous one (negative), over the temperature, cross-entropy to 0."""
    cos = torch.nn.CosineSimilarity(dim=-1)
    posi = cos(pro1, pro2)
    logits = posi.reshape(-1, 1)
    nega = cos(pro1, pro3)
    logits = torch.cat((logits, nega.reshape(-1, 1)), dim=1)
    logits /= temperature
    labels = torch.zeros(pro1.size(0)).long()
    return mu * nn.CrossEntropyLoss()(logits, labels)


def _moon_seen(previous=True, has=None):
    return Seen(Y, Representation(Z, LOGITS), Representation(ZG, GLOBAL_LOGITS),
                Representation(ZP, LOGITS) if previous else None, has)


@pytest.mark.parametrize("mu, temperature", [(1.0, 0.5), (5.0, 0.1), (0.01, 1.0)])
def test_moon_term_is_the_authors_contrastive_loss(mu, temperature):
    got = MOON(mu=mu, temperature=temperature).forward_term(_moon_seen())
    torch.testing.assert_close(got, moon_authors(Z, ZG, ZP, temperature, mu), rtol=1e-6, atol=1e-7)


def test_moon_term_by_hand_on_two_samples():
    z, zg, zp = torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[1.0, 1.0], [0.0, 1.0]]), torch.tensor([[0.0, 1.0], [3.0, 0.0]])
    seen = Seen(torch.zeros(2, dtype=torch.long), Representation(z, None), Representation(zg, None), Representation(zp, None))
    # sample 1: cos(z, zg) = 1/sqrt(2), cos(z, zp) = 0; sample 2: 1 and 0; tau = 0.5
    l1 = -math.log(math.exp(2 / math.sqrt(2)) / (math.exp(2 / math.sqrt(2)) + 1))
    l2 = -math.log(math.exp(2) / (math.exp(2) + 1))
    assert float(MOON(mu=2.0, temperature=0.5).forward_term(seen)) == pytest.approx(2.0 * (l1 + l2) / 2, rel=1e-6)


def test_moon_has_no_term_without_a_previous_model():
    moon = MOON()
    assert moon.forward_term(_moon_seen(previous=False)) is None  # the authors' first round
    masked = moon.forward_term(_moon_seen(has=torch.tensor(False)))
    assert float(masked) == 0.0
    assert float(moon.forward_term(_moon_seen(has=torch.tensor(True)))) == pytest.approx(
        float(moon_authors(Z, ZG, ZP, 0.5, 1.0)), rel=1e-6)


def test_moon_declares_a_projection_head_by_default_and_none_as_an_option():
    assert MOON().sees.projection_head == 256 and MOON(projection_dim=8).sees.projection_head == 8
    none = MOON(projection="none").sees
    assert none.projection_head == 0 and none.representation and none.global_model and none.previous_model


# -- FedLC -----------------------------------------------------------------------------------------
COUNTS = torch.tensor([12.0, 0.0, 3.0, 40.0])


def fedlc_port(out, target, class2data, calibration_temp):
    """bytedance/FedDecorr@973e4af approach/fedlogitcal.py:95-98: the calibration in place, then cross-entropy
    (a class the client lacks: 0 ** -0.25 = inf, its logit -inf)."""
    out = out.clone()
    out -= calibration_temp * class2data.unsqueeze(0) ** (-0.25)
    return nn.CrossEntropyLoss()(out, target)


def fedlc_flbench(logit, y, counts, tau):
    """KarhouTam/FL-bench@06e658b src/client/fedlc.py:13-34: counts with 1e-8 for a class the client lacks,
    the calibrated softmax written out."""
    counts = torch.where(counts > 0, counts, torch.tensor(1e-8))
    cal_logit = torch.exp(logit - (tau * torch.pow(counts, -1 / 4).unsqueeze(0).expand((logit.shape[0], -1))))
    y_logit = torch.gather(cal_logit, dim=-1, index=y.unsqueeze(1))
    loss = -torch.log(y_logit / cal_logit.sum(dim=-1, keepdim=True))
    return loss.sum() / logit.shape[0]


def _fedlc_loss(objective, logits=LOGITS, y=None):
    y = torch.tensor([0, 3, 2, 2, 0, 3]) if y is None else y  # classes the client holds
    calibrated = objective.task_logits(Seen(y, Representation(None, logits), label_counts=COUNTS))
    return F.cross_entropy(calibrated, y)


@pytest.mark.parametrize("tau", [1.0, 0.1, 3.0])
def test_fedlc_calibration_is_the_ports_and_fl_benchs(tau):
    y = torch.tensor([0, 3, 2, 2, 0, 3])
    torch.testing.assert_close(_fedlc_loss(FedLC(tau=tau)), fedlc_port(LOGITS, y, COUNTS, tau), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(_fedlc_loss(FedLC(tau=tau, absent="epsilon")), fedlc_flbench(LOGITS, y, COUNTS, tau),
                               rtol=1e-5, atol=1e-6)


def test_fedlc_by_hand_and_a_lacking_class_is_out_of_the_softmax():
    logits = torch.tensor([[0.0, 5.0, 1.0, 0.5]])
    calibrated = FedLC(tau=2.0).task_logits(Seen(torch.tensor([0]), Representation(None, logits), label_counts=COUNTS))
    want = [0.0 - 2.0 * 12 ** -0.25, -math.inf, 1.0 - 2.0 * 3 ** -0.25, 0.5 - 2.0 * 40 ** -0.25]
    assert calibrated[0].tolist() == pytest.approx(want)
    loss = F.cross_entropy(calibrated, torch.tensor([0]))
    rest = torch.tensor(want)[[0, 2, 3]]
    assert float(loss) == pytest.approx(float(-(rest[0] - rest.logsumexp(0))), rel=1e-6)
    logits.requires_grad_()
    F.cross_entropy(FedLC().task_logits(Seen(torch.tensor([0]), Representation(None, logits), label_counts=COUNTS)),
                    torch.tensor([0])).backward()
    assert torch.isfinite(logits.grad).all() and float(logits.grad[0, 1]) == 0.0


# -- FedNTD ----------------------------------------------------------------------------------------
def refine_as_not_true(logits, targets, num_classes):
    """Lee-Gihun/FedNTD@be00ee5 algorithms/fedntd/utils.py:6-14."""
    nt_positions = torch.arange(0, num_classes).to(logits.device)
    nt_positions = nt_positions.repeat(logits.size(0), 1)
    nt_positions = nt_positions[nt_positions[:, :] != targets.view(-1, 1)]
    nt_positions = nt_positions.view(-1, num_classes - 1)
    return torch.gather(logits, 1, nt_positions)


def ntd_authors(logits, dg_logits, targets, tau, beta, num_classes):
    """Lee-Gihun/FedNTD@be00ee5 algorithms/fedntd/criterion.py:30-44 (NTD_Loss._ntd_loss) times beta (line 26)."""
    logits = refine_as_not_true(logits, targets, num_classes)
    pred_probs = F.log_softmax(logits / tau, dim=1)
    with torch.no_grad():
        dg_logits = refine_as_not_true(dg_logits, targets, num_classes)
        dg_probs = torch.softmax(dg_logits / tau, dim=1)
    return beta * (tau ** 2) * nn.KLDivLoss(reduction="batchmean")(pred_probs, dg_probs)


def test_not_true_logits_keep_the_other_classes_in_order():
    assert torch.equal(not_true(LOGITS, Y), refine_as_not_true(LOGITS, Y, C))
    assert not_true(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([1])).tolist() == [[1.0, 3.0]]


@pytest.mark.parametrize("tau, beta", [(1.0, 1.0), (3.0, 0.5), (0.5, 2.0)])
def test_fedntd_term_is_the_authors_not_true_distillation(tau, beta):
    seen = Seen(Y, Representation(None, LOGITS), Representation(None, GLOBAL_LOGITS))
    got = FedNTD(tau=tau, beta=beta).forward_term(seen)
    torch.testing.assert_close(got, ntd_authors(LOGITS, GLOBAL_LOGITS, Y, tau, beta, C), rtol=1e-6, atol=1e-7)


def test_fedntd_by_hand_and_its_gradient_reaches_the_local_logits_only():
    local = torch.tensor([[2.0, 0.0, 0.0]], requires_grad=True)
    teacher = torch.tensor([[9.0, 1.0, 0.0]])  # the true class 0 is removed: the teacher's rest is (1, 0)
    term = FedNTD(tau=1.0, beta=1.0).forward_term(Seen(torch.tensor([0]), Representation(None, local),
                                                       Representation(None, teacher)))
    p = torch.softmax(torch.tensor([1.0, 0.0]), 0)  # the local rest (0, 0) is uniform
    assert float(term.detach()) == pytest.approx(float((p * (p / 0.5).log()).sum()), rel=1e-6)
    term.backward()
    assert float(local.grad[0, 0]) == 0.0  # the true class takes no part


# -- FedDecorr -------------------------------------------------------------------------------------
def feddecorr_authors(x):
    """bytedance/FedDecorr@973e4af loss.py:30-55 (FedDecorrLoss)."""
    eps = 1e-8
    N, C = x.shape
    if N == 1:
        return 0.0
    x = x - x.mean(dim=0, keepdim=True)
    x = x / torch.sqrt(eps + x.var(dim=0, keepdim=True))
    corr_mat = torch.matmul(x.t(), x)
    n, m = corr_mat.shape
    off = corr_mat.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()
    return (off.pow(2)).mean() / N


@pytest.mark.parametrize("beta", [0.1, 0.05])
def test_feddecorr_term_is_the_authors_loss_times_beta(beta):
    got = FedDecorr(beta=beta).forward_term(Seen(Y, Representation(Z, None)))
    torch.testing.assert_close(got, beta * feddecorr_authors(Z), rtol=1e-5, atol=1e-7)


def test_feddecorr_by_hand_and_the_papers_scale():
    h = torch.tensor([[1.0, 2.0], [3.0, 5.0], [2.0, 2.0]])
    # standardised (unbiased variances 1 and 3): columns (-1, 1, 0) and (-1, 2, -1)/sqrt(3), so
    # G = [[2, sqrt(3)], [sqrt(3), 2]] (up to the 1e-8 under the roots)
    code = FedDecorr(beta=1.0).forward_term(Seen(Y[:3], Representation(h, None)))
    assert float(code) == pytest.approx(3 / 3, rel=1e-5)  # the mean of the two off-diagonal squares (3), / N = 3
    paper = FedDecorr(beta=1.0, scale="paper").forward_term(Seen(Y[:3], Representation(h, None)))
    assert float(paper) == pytest.approx((4 + 4 + 3 + 3) / 9 / 4, rel=1e-5)  # ||G/N||^2 / d^2
    assert FedDecorr().forward_term(Seen(Y[:1], Representation(h[:1], None))) is None  # one sample adds 0


# -- configs and refusals --------------------------------------------------------------------------
@pytest.mark.parametrize("name, cls, shown", [("moon", MOON, "MOON"), ("fedlc", FedLC, "FedLC"),
                                              ("fedntd", FedNTD, "FedNTD"), ("feddecorr", FedDecorr, "FedDecorr")])
def test_each_yaml_composes_with_its_display_name_and_the_constructors_defaults(name, cls, shown):
    import inspect

    cfg = compose_config(f"client/objective={name}")
    objective = instantiate(cfg.client).objective
    assert type(objective) is cls and objective.display_name == shown
    defaults = inspect.signature(cls.__init__).parameters
    for key, value in cfg.client.objective.items():
        if key not in ("_target_", "display_name"):
            assert defaults[key].default == value, key


@pytest.mark.parametrize("build, message", [
    (lambda: MOON(mu=-1), r"^client.objective.mu=-1 is not allowed"),
    (lambda: MOON(temperature=0), r"^client.objective.temperature=0 is not allowed"),
    (lambda: MOON(projection="mlp"), r"^client.objective.projection='mlp' is not allowed; choose one of head, none$"),
    (lambda: FedLC(tau=-0.5), r"^client.objective.tau=-0.5 is not allowed"),
    (lambda: FedLC(absent="zero"), r"^client.objective.absent='zero' is not allowed; choose one of removed, epsilon$"),
    (lambda: FedNTD(tau=0), r"^client.objective.tau=0 is not allowed"),
    (lambda: FedDecorr(scale="d2"), r"^client.objective.scale='d2' is not allowed; choose one of batch, paper$"),
])
def test_bad_settings_name_the_key(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_a_model_without_a_representation_is_refused_before_training():
    from fedagg.loop.assembly import check_model_for

    with pytest.raises(ValueError, match=r"^client/objective=moon reads the model's representation, but Linear does "
                                         r"not expose one"):
        check_model_for(MOON(), nn.Linear(3, 2), {"client/objective": "moon"})
    check_model_for(FedNTD(), nn.Linear(3, 2), {})  # logits only: any model


def test_the_comparison_tunes_each_methods_declared_ranges():
    from test_compare import LR, space_of

    assert space_of("client/objective=moon") == {"client.lr": LR, "client.objective.mu": (1e-3, 10.0, True),
                                                 "client.objective.temperature": (0.1, 1.0, True)}
    assert space_of("client/objective=fedlc") == {"client.lr": LR, "client.objective.tau": (0.01, 10.0, True)}
    assert space_of("client/objective=fedntd") == {"client.lr": LR, "client.objective.beta": (0.1, 10.0, True),
                                                   "client.objective.tau": (0.5, 4.0, True)}
    assert space_of("client/objective=feddecorr") == {"client.lr": LR, "client.objective.beta": (0.01, 0.3, True)}
    assert space_of("aggregator=fedbn") == {"client.lr": LR}
    assert space_of("aggregator=elastic") == {"aggregator.mu": (0.5, 0.99, False), "aggregator.tau": (0.1, 1.0, False),
                                              "client.lr": LR}
