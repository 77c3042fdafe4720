"""Robust rules on hand-made matrices with known answers, bucketing, and the attacks' effect on known updates."""

import json

import numpy as np
import pytest
import torch

from conftest import compose_config
from fedagg import Aggregator, Needs, RoundInputs
from fedagg.aggregators.centered_clip import CenteredClip
from fedagg.aggregators.geomed import GeoMed, weiszfeld
from fedagg.aggregators.inputs import ClientSetup
from fedagg.aggregators.krum import Krum, MultiKrum
from fedagg.aggregators.median import Median
from fedagg.aggregators.robust import RobustRule
from fedagg.aggregators.trimmed_mean import TrimmedMean
from fedagg.attacks.base import Attack
from fedagg.attacks.label_flip import LabelFlip
from fedagg.attacks.model import ALIE, IPM, Gaussian, SignFlip, alie_z
from fedagg.clients.trainer import LocalSolver
from fedagg.seeding import generator
from fedagg.run import train

PLAIN = LocalSolver(0.0, False, 0.0, 0.0, False)


def agg(rule, models, w=None, **kw):
    models = torch.as_tensor(models, dtype=torch.float32)
    w = torch.zeros(models.shape[1]) if w is None else torch.as_tensor(w, dtype=torch.float32)
    return rule.aggregate(RoundInputs.of(w, models, **kw))


# ---------------------------------------------------------------- median and trimmed mean
def test_median_odd_count_and_the_share_each_client_is_kept():
    rule = Median()
    res = agg(rule, [[1.0, 9.0, 0.0], [3.0, 2.0, 0.5], [2.0, 100.0, 7.0]])  # client 2: an outlier in two coordinates
    new = res.params
    assert torch.equal(new, torch.tensor([2.0, 9.0, 0.5]))
    assert torch.allclose(res.weights, torch.tensor([1 / 3, 1 / 3, 1 / 3]))  # each is the median once


def test_median_even_count_averages_the_two_middle_values():
    rule = Median()
    res = agg(rule, [[1.0, -4.0], [4.0, 0.0], [2.0, 1.0], [1e6, 2.0]])
    new = res.params
    assert torch.equal(new, torch.tensor([3.0, 0.5]))  # (2 + 4) / 2 and (0 + 1) / 2: the far value changes nothing
    # middle values: coordinate 0 clients 2 and 1, coordinate 1 clients 1 and 2, each a half
    assert torch.allclose(res.weights, torch.tensor([0.0, 0.5, 0.5, 0.0]))


def test_median_with_ties():
    rule = Median()
    res = agg(rule, [[5.0, 1.0], [5.0, 1.0], [5.0, 3.0]])
    new = res.params
    assert torch.equal(new, torch.tensor([5.0, 1.0]))
    assert float(res.weights.sum()) == pytest.approx(1.0) and bool((res.weights >= 0).all())


def test_trimmed_mean_drops_the_extremes_of_each_coordinate():
    rule = TrimmedMean(beta=0.2)  # K = 5: b = 1 from each end
    models = [[1.0, 10.0], [2.0, -50.0], [3.0, 11.0], [4.0, 12.0], [100.0, 13.0]]
    res = agg(rule, models)
    new = res.params
    assert torch.allclose(new, torch.tensor([(2 + 3 + 4) / 3, (10 + 11 + 12) / 3]))
    # kept values: coordinate 0 clients 1, 2, 3; coordinate 1 clients 0, 2, 3 -> shares of 6 kept values
    assert torch.allclose(res.weights, torch.tensor([1, 1, 2, 2, 0]) / 6)
    assert torch.allclose(agg(TrimmedMean(beta=0.0), models).params, torch.tensor(models).mean(0))  # beta 0: the mean
    assert torch.allclose(agg(TrimmedMean(beta=0.2), models[:4]).params, torch.tensor(models[:4]).mean(0))  # K = 4: b = 0
    with pytest.raises(ValueError, match=r"aggregator.beta=0.5 is not allowed; it must be in \[0, 0.5\)"):
        TrimmedMean(beta=0.5)


# ---------------------------------------------------------------- Krum and Multi-Krum
CLUSTER = [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.2], [30.0, 30.0]]


def krum_scores_by_hand(points, neighbours):
    p = np.asarray(points, np.float64)
    d = ((p[:, None] - p[None]) ** 2).sum(-1)
    return np.array([np.sort(np.delete(d[i], i))[:neighbours].sum() for i in range(len(p))])


def test_krum_picks_the_model_closest_to_its_neighbours():
    rule = Krum(f=1)  # K = 5, f = 1: each score sums the 2 nearest squared distances
    scores = krum_scores_by_hand(CLUSTER, 2)  # [2, 2.44, 2.04, 2.44, 1681.24]: client 0 wins
    best = int(np.argmin(scores))
    res = agg(rule, CLUSTER)
    new = res.params
    assert best == 0 and torch.equal(new, torch.tensor(CLUSTER[0]))
    assert torch.equal(res.weights, torch.tensor([1.0, 0, 0, 0, 0]))


def test_multikrum_averages_the_lowest_scores():
    rule = MultiKrum(f=1)  # m = K - f = 4: everyone but the outlier
    res = agg(rule, CLUSTER)
    new = res.params
    assert torch.allclose(new, torch.tensor(CLUSTER[:4]).mean(0))
    assert torch.allclose(res.weights, torch.tensor([0.25, 0.25, 0.25, 0.25, 0.0]))
    two = MultiKrum(f=1, m=2)
    assert torch.allclose(agg(two, CLUSTER).params, torch.tensor([0.0, 0.5]))  # clients 0 and 2 score lowest


def test_krum_assumes_the_attacks_fraction_and_refuses_rounds_too_small():
    assert Krum(attack_fraction=0.2).corrupted(20) == 4 and Krum(f=3, attack_fraction=0.2).corrupted(20) == 3
    Krum(attack_fraction=0.2).check_clients(ClientSetup(PLAIN, 20, 5))  # K = 5, f = 1: 5 - 1 - 2 = 2
    with pytest.raises(ValueError, match=r"aggregator.f=1 is not allowed with 3 models a round \(clients_per_round=3, "
                                         r"bucket_size=1\): Krum needs K - f - 2 >= 1"):
        Krum(f=1).check_clients(ClientSetup(PLAIN, 20, 3))
    with pytest.raises(ValueError, match=r"with 2 models a round \(clients_per_round=4, bucket_size=2\)"):
        MultiKrum(bucket_size=2).check_clients(ClientSetup(PLAIN, 20, 4))


# ---------------------------------------------------------------- geometric median and centered clipping
def weiszfeld_reference(points, alpha, iters=2000):
    p, a = np.asarray(points, np.float64), np.asarray(alpha, np.float64)
    v = a @ p
    for _ in range(iters):
        b = a / np.maximum(np.linalg.norm(p - v, axis=1), 1e-12)
        v = b @ p / b.sum()
    return v


def test_geomed_is_the_geometric_median_and_resists_an_outlier():
    points = [[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [1.5, 1.8], [40.0, -40.0]]
    n = torch.tensor([1, 2, 1, 1, 1])
    rule = GeoMed(max_iter=200, tol=1e-12)
    w = torch.tensor([0.5, 0.5])  # computed on the updates W_k - w: the same median
    res = agg(rule, points, w=w, num_samples=n)
    new = res.params
    expected = weiszfeld_reference(points, n.numpy() / 6)
    assert np.allclose(new.double().numpy(), expected, atol=1e-4)
    cluster, mean = np.asarray(points[:4]).mean(0), n.numpy() / 6 @ np.asarray(points)
    assert np.linalg.norm(expected - cluster) < np.linalg.norm(mean - cluster) / 5  # the outlier barely pulls it
    assert torch.allclose(res.weights, torch.full((5,), 0.2))  # SPEC: uniform reported weights
    ten = GeoMed()  # SPEC's 10 steps at most: close already
    ten_res = agg(ten, points, w=w, num_samples=n)
    assert np.allclose(ten_res.params.double().numpy(), expected, atol=0.05)
    assert 1 <= ten_res.metrics["weiszfeld_steps"] <= 10


def test_weiszfeld_stops_when_the_objective_settles():
    same = torch.tensor([[1.0, 1.0]] * 3)
    v, steps = weiszfeld(same, torch.full((3,), 1 / 3), 1e-6, 10, 1e-5)
    assert torch.allclose(v, torch.tensor([1.0, 1.0])) and steps == 1


def test_centered_clip_moves_each_offset_at_most_tau():
    rule = CenteredClip(tau=1.0)
    updates = torch.tensor([[0.5, 0.0], [0.0, 0.5], [10.0, 0.0]])
    w = torch.tensor([1.0, -1.0])
    res = agg(rule, w + updates, w=w)
    new = res.params
    # from v = 0: norms 0.5, 0.5, 10 -> scales 1, 1, 0.1 -> v = mean([.5, 0], [0, .5], [1, 0])
    assert torch.allclose(new, w + torch.tensor([0.5, 0.5 / 3]))
    momentum = CenteredClip(tau=1.0, start="momentum")
    momentum_res = agg(momentum, w + updates, w=w)
    first = momentum_res.params
    momentum_res = agg(momentum, w + updates, w=w)  # starts from the first round's v this time
    second = momentum_res.params
    v1 = first - w
    offsets = updates - v1
    scale = (1.0 / offsets.norm(dim=1)).clamp(max=1.0)
    assert torch.allclose(second, w + v1 + (scale[:, None] * offsets).mean(0))


# ---------------------------------------------------------------- bucketing
class Recorder(RobustRule):
    """Returns the mean of what it is given, and keeps it."""

    def combine(self, inputs, models, num_samples):
        self.seen = (models.clone(), num_samples.clone())
        k = models.shape[0]
        return models.mean(0), torch.full((k,), 1.0 / k)


def test_bucketing_groups_a_seeded_shuffle():
    models = torch.arange(10.0).view(5, 2)
    n = torch.tensor([1, 2, 3, 4, 5])
    rule = Recorder(bucket_size=2)
    res = rule.aggregate(RoundInputs.of(torch.zeros(2), models, num_samples=n, round=3, seed=7))
    perm = torch.randperm(5, generator=generator(7, "bucketing", 3))  # of the clients in ascending id (0..4 here)
    groups = perm.split(2)  # sizes 2, 2, 1
    seen_models, seen_n = rule.seen
    assert torch.allclose(seen_models, torch.stack([models[g].mean(0) for g in groups]))
    assert torch.equal(seen_n, torch.stack([n[g].sum() for g in groups]).float())
    expected = torch.zeros(5)
    for g in groups:
        expected[g] = (1 / 3) / len(g)  # a bucket's weight, shared by its members
    assert torch.allclose(res.weights, expected)
    listed_otherwise = Recorder(bucket_size=2)  # the same clients listed in another order: the same buckets
    listed_otherwise_res = listed_otherwise.aggregate(RoundInputs.of(torch.zeros(2), models.flip(0), num_samples=n.flip(0),
                                              client_ids=torch.arange(5).flip(0), round=3, seed=7))
    assert torch.equal(listed_otherwise.seen[0], seen_models)
    assert torch.allclose(listed_otherwise_res.weights, expected.flip(0))


def test_bucketing_lets_the_median_average_honest_clients():
    models = torch.tensor([[1.0], [1.0], [1.0], [1.0], [5.0], [5.0]])
    Median_res = agg(Median(), models)
    plain = Median_res.params
    Median_res = agg(Median(bucket_size=3), models, seed=0)
    bucketed = Median_res.params
    assert torch.equal(plain, torch.tensor([1.0])) and 1.0 <= float(bucketed) <= 5.0


@pytest.mark.parametrize("rule", [Median, TrimmedMean, GeoMed, CenteredClip])
def test_a_bucket_as_large_as_the_round_is_refused_naming_the_round_size(rule):
    rule(bucket_size=4).check_clients(ClientSetup(PLAIN, 20, 5))  # two buckets: still a median of something
    with pytest.raises(ValueError) as err:
        rule(bucket_size=5).check_clients(ClientSetup(PLAIN, 20, 5))
    assert str(err.value) == ("aggregator.bucket_size=5 is not allowed with clients_per_round=5: one bucket would "
                              "hold every client of a round and the rule would be their plain mean; use a bucket_size "
                              "below 5, or 1 for no bucketing")
    rule(bucket_size=1).check_clients(ClientSetup(PLAIN, 1, 1))  # no bucketing: nothing to refuse


def notices(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fedagg" and r.levelname == "WARNING"]


def test_degenerate_but_legal_robust_settings_get_one_notice(caplog):
    caplog.set_level("WARNING", logger="fedagg")
    TrimmedMean(beta=0.1).check_clients(ClientSetup(PLAIN, 20, 9))  # floor(0.9) = 0
    TrimmedMean(beta=0.1).check_clients(ClientSetup(PLAIN, 20, 10))  # floor(1.0) = 1: trims, no notice
    TrimmedMean(beta=0.0).check_clients(ClientSetup(PLAIN, 20, 9))  # asked for no trimming: no notice
    MultiKrum(f=0, m=12).check_clients(ClientSetup(PLAIN, 20, 10))
    MultiKrum(f=0, m=10).check_clients(ClientSetup(PLAIN, 20, 10))  # m = K: no clamping
    assert notices(caplog) == [
        "aggregator.beta=0.1 trims nothing from 9 models a round (floor(beta * 9) = 0): the trimmed mean is the plain "
        "mean; a beta of at least 0.111 trims one value each side",
        "aggregator.m=12 is more than the 10 models a round (clients_per_round=10, bucket_size=1): Multi-Krum "
        "averages every one of the 10 (m is clamped to K)",
    ]


def test_an_attack_that_corrupts_nobody_gets_one_notice(caplog):
    from hydra.utils import instantiate

    from fedagg.loop.assembly import Parts, connect
    from fedagg.config.settings import Settings
    from fedagg.run import GROUPS

    caplog.set_level("WARNING", logger="fedagg")
    for fraction in (0.05, 0.1):  # floor(0.5) = 0 clients; floor(1.0) = 1
        cfg = compose_config("attack=sign_flip", f"attack.fraction={fraction}", "model=mlp")
        connect(Parts(**{g: instantiate(cfg[g], _convert_="all") for g in GROUPS}), Settings(seed=0, num_clients=10))
    assert notices(caplog) == ["attack.fraction=0.05 corrupts nobody with num_clients=10 (floor(0.05 * 10) = 0): the "
                               "run has no attacker; a fraction of at least 0.1 corrupts one client"]


# ---------------------------------------------------------------- attacks on a known update
W0 = torch.tensor([1.0, 1.0])
SENT = torch.tensor([[2.0, 3.0], [4.0, 3.0], [9.0, 9.0]])  # updates [1, 2], [3, 2], [8, 8]
BAD = torch.tensor([False, False, True])


def test_sign_flip_and_ipm():
    out = SignFlip(scale=2.0).corrupt(W0, SENT, BAD, torch.Generator())
    assert torch.equal(out[:2], SENT[:2]) and torch.equal(out[2], W0 - 2 * torch.tensor([8.0, 8.0]))
    out = IPM(epsilon=0.5).corrupt(W0, SENT, BAD, torch.Generator())
    assert torch.equal(out[2], W0 - 0.5 * torch.tensor([2.0, 2.0]))  # honest mean update (2, 2)


def test_alie_sends_mean_minus_z_std_of_the_honest_updates():
    out = ALIE(z=1.5).corrupt(W0, SENT, BAD, torch.Generator())
    # honest updates [1, 2] and [3, 2]: mean (2, 2), population std (1, 0)
    assert torch.allclose(out[2], W0 + torch.tensor([2.0 - 1.5, 2.0]))
    assert alie_z(20, 4) == pytest.approx(0.38532, abs=1e-4)  # s = 11 - 4 = 7: Phi^-1(13/20)
    both = torch.tensor([False, True, True])
    out = ALIE().corrupt(W0, SENT, both, torch.Generator())
    assert torch.equal(out[1], out[2]) and torch.allclose(out[1], W0 + torch.tensor([1.0, 2.0]))  # std 0


def test_gaussian_replaces_the_model_with_noise_from_its_stream():
    g1, g2 = generator(0, "attack", 4), generator(0, "attack", 4)
    out = Gaussian(sigma=2.0).corrupt(W0, SENT, BAD, g1)
    assert torch.equal(out[:2], SENT[:2])
    assert torch.equal(out[2], 2.0 * torch.randn((3, 2), generator=g2)[2])


def test_label_flip_and_the_corrupted_ids():
    labels = torch.tensor([0, 1, 2, 3, 9, 4])
    out = LabelFlip().poison_labels(labels, torch.tensor([1, 4]), num_classes=10)
    assert out.tolist() == [0, 8, 2, 3, 0, 4] and labels.tolist() == [0, 1, 2, 3, 9, 4]
    ids = LabelFlip(fraction=0.2).corrupted_clients(seed=5, num_clients=20)
    assert len(ids) == 4 and ids == sorted(torch.randperm(20, generator=generator(5, "attack"))[:4].tolist())
    assert Attack().corrupted_clients(5, 20) == []
    with pytest.raises(ValueError, match=r"attack.fraction=0.5 is not allowed; it must be in \[0, 0.5\)"):
        SignFlip(fraction=0.5)


# ---------------------------------------------------------------- in the round loop
class Received(Aggregator):
    """FedAvg that keeps the client models and validation accuracies it received."""

    seen: list = []

    def __init__(self, weighting="samples"):
        super().__init__(weighting)
        self.needs = Needs(val_acc="server", server_samples=100)

    def client_weights(self, inputs):
        Received.seen.append((inputs.client_ids.clone(), inputs.global_params.clone(), inputs.client_params.clone(),
                              inputs.val_acc.clone()))
        return super().client_weights(inputs)


def test_model_attacks_replace_what_corrupted_participants_send(tmp_path):
    Received.seen = []
    summary = train(compose_config("rounds=2", "device=cpu", "attack=gaussian", "attack.fraction=0.3",
                                   f"aggregator._target_={__name__}.Received"), tmp_path)
    corrupted = summary["corrupted_clients"]
    assert len(corrupted) == 3 and json.loads((tmp_path / "summary.json").read_text())["corrupted_clients"] == corrupted
    for ids, w, models, acc in Received.seen:
        bad = torch.tensor([i in corrupted for i in ids.tolist()])
        noise = models[bad]
        assert abs(float(noise.mean())) < 0.05 and abs(float(noise.std()) - 1.0) < 0.05  # N(0, 1), not a trained model
        assert float((models[~bad] - w).norm(dim=1).max()) < 5  # the honest ones moved a little from w
        # the server scores what it received: noise models near chance, trained ones far above it
        assert float(acc[bad].max()) < float(acc[~bad].min())


def test_label_flip_gives_the_same_models_in_both_engines(tmp_path):
    for engine in ("sequential", "parallel"):
        train(compose_config("rounds=2", "device=cpu", "attack=label_flip", "attack.fraction=0.3", f"engine={engine}"),
              tmp_path / engine)
    a, b = (torch.load(tmp_path / e / "model.pt") for e in ("sequential", "parallel"))
    for key in a:
        assert float((a[key] - b[key]).norm() / a[key].norm()) < 1e-4, key
    clean = tmp_path / "clean"
    train(compose_config("rounds=2", "device=cpu", "engine=sequential"), clean)
    first = next(iter(a))
    assert not torch.equal(torch.load(clean / "model.pt")[first], a[first])  # the flip did act


def test_bad_attack_and_rule_settings_are_refused_before_training(tmp_path):
    cases = [("attack=sign_flip attack.fraction=0.5", r"^attack.fraction=0.5 is not allowed; it must be in \[0, 0.5\)"),
             ("aggregator=krum attack=ipm clients_per_round=2", r"^aggregator.f=0 is not allowed with 2 models a round"),
             ("aggregator=trimmed_mean aggregator.beta=0.6", r"^aggregator.beta=0.6 is not allowed")]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            train(compose_config("rounds=1", "device=cpu", *overrides.split()), tmp_path)
        assert type(info.value).__name__ == "SetupError"
    assert not (tmp_path / "metrics.csv").exists()
