"""The upload channel (SPEC "Upload channel"): each compressor, error feedback, DP, bits, the accountant."""

import csv
import math

import numpy as np
import pytest
import torch

from fedagg.aggregators.base import FedAvg
from fedagg.aggregators.fedams import FedAMS, FedCAMS
from fedagg.aggregators.inputs import RoundInputs
from fedagg.aggregators.krum import Krum
from fedagg.attacks.base import Attack
from fedagg.attacks.model import SignFlip
from fedagg.channel import DP, QSGD, Channel, RandK, Setup, Sign, TopK
from fedagg.channel.privacy import epsilon
from fedagg.loop.assembly import describe
from fedagg.run import train
from conftest import compose_config
from stopping import StopInRound2, stopped_in_round_2
from uploads import release, through_channel, upload

G = torch.Generator().manual_seed(0)


def one_round(channel, models, ids, global_params=None, corrupted=None, attack=None, r=1):
    """The models the aggregator receives from one round through `channel`."""
    up = upload(*models.shape, ids=ids, corrupted=corrupted, r=r, start=global_params)
    return channel.connect(attack or Attack()).transmit(models, up).models


def test_topk_keeps_the_largest_magnitudes_and_breaks_ties_by_index():
    u = torch.tensor([[3.0, -3.5, 1.0, 0.5], [1.0, -1.0, 1.0, 0.0]])
    got = TopK(ratio=0.5).compress(u, G)  # k = ⌈0.5 · 4⌉ = 2
    assert torch.equal(got, torch.tensor([[3.0, -3.5, 0.0, 0.0], [1.0, -1.0, 0.0, 0.0]]))  # a tie: lower index
    assert TopK(ratio=0.3).bits_up(4) == 2 * (32 + 2)  # ⌈1.2⌉ = 2 entries, each 32 bits and a 2-bit index
    assert TopK(ratio=0.01).bits_up(4810) == 49 * (32 + 13)


def test_topk_rounding_floor_keeps_floor_of_ratio_times_p_at_least_one():
    u = torch.tensor([[3.0, -3.5, 1.0, 0.5, 0.25]])
    floor = TopK(ratio=0.5, rounding="floor")  # 2.5 entries: 2 (ceil would keep 3)
    assert torch.equal(floor.compress(u, G), torch.tensor([[3.0, -3.5, 0.0, 0.0, 0.0]]))
    assert torch.equal(TopK(ratio=0.5).compress(u, G), torch.tensor([[3.0, -3.5, 1.0, 0.0, 0.0]]))
    assert TopK(ratio=0.1, rounding="floor").bits_up(5) == 1 * (32 + 3)  # 0.5 entries: still one
    assert TopK(ratio=1 / 64, rounding="floor").bits_up(4810) == 75 * (32 + 13)  # ceil: 76
    with pytest.raises(ValueError, match=r"^channel\.topk\.rounding='round' is not allowed"):
        TopK(rounding="round")


def test_sign_is_the_scaled_sign():
    got = Sign().compress(torch.tensor([[1.0, -2.0, 3.0, 0.0]]), G)
    assert torch.equal(got, torch.tensor([[1.5, -1.5, 1.5, 0.0]]))  # ‖u‖₁ / P = 6 / 4
    assert Sign().bits_up(4) == 36


def test_randk_keeps_k_entries_and_is_unbiased():
    u = torch.tensor([[2.0, -1.0, 0.5, 4.0, -3.0]])
    rk, n = RandK(ratio=0.4), 4000  # k = 2, kept entries scaled by 5/2
    g = torch.Generator().manual_seed(1)
    draws = rk.compress(u.repeat(n, 1), g)  # each row is drawn on its own
    assert bool(((draws != 0).sum(dim=1) == 2).all())
    kept = draws[draws != 0].reshape(n, 2)
    assert set(torch.unique(kept / 2.5).tolist()) <= set(u[0].tolist())
    se = u[0].abs() * math.sqrt(5 / 2 - 1) / math.sqrt(n)  # per-coordinate standard error of the mean
    assert bool(((draws.mean(0) - u[0]).abs() < 5 * se).all())
    assert rk.bits_up(5) == 2 * 32 + 32


def test_qsgd_is_unbiased_on_its_levels():
    u = torch.tensor([[3.0, -4.0]])  # ‖u‖ = 5, s = 4: s|u|/‖u‖ = (2.4, 3.2)
    q, n = QSGD(levels=4), 4000
    g = torch.Generator().manual_seed(2)
    draws = q.compress(u.repeat(n, 1), g)
    assert set(draws[:, 0].tolist()) == {2.5, 3.75} and set(draws[:, 1].tolist()) == {-3.75, -5.0}  # levels 2, 3 and 3, 4
    se = 1.25 * torch.sqrt(torch.tensor([0.4 * 0.6, 0.2 * 0.8])) / math.sqrt(n)
    assert bool(((draws.mean(0) - u[0]).abs() < 5 * se).all())
    assert q.bits_up(2) == 32 + 2 * (1 + 3)  # ⌈log2 5⌉ = 3
    assert torch.equal(q.compress(torch.zeros(1, 3), g), torch.zeros(1, 3))  # ‖u‖ = 0: nothing to scale


def test_error_feedback_over_two_rounds_is_kept_by_client_id():
    channel = Channel([TopK(ratio=0.5)])
    first = one_round(channel, torch.tensor([[3.0, 1.0, -2.0, 0.5], [1.0, 0.0, 0.0, 0.0]]), [7, 2])
    assert torch.equal(first[0], torch.tensor([3.0, 0.0, -2.0, 0.0]))  # e_7 = (0, 1, 0, 0.5)
    state = channel.state_dict()
    # round 2, listed in another order: u_7 = e_7 + Δ = (0.5, 1.2, 0.1, 1.5)
    second = one_round(channel, torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.5, 0.2, 0.1, 1.0]]), [2, 7], r=2)
    torch.testing.assert_close(second[1], torch.tensor([0.0, 1.2, 0.0, 1.5]))
    torch.testing.assert_close(channel.stages[0].memory.get(7, torch.zeros(4)), torch.tensor([0.5, 0.0, 0.1, 0.0]))
    resumed = Channel([TopK(ratio=0.5)])
    resumed.load_state_dict(state)
    again = one_round(resumed, torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.5, 0.2, 0.1, 1.0]]), [2, 7], r=2)
    assert torch.equal(again, second)
    plain = one_round(Channel([TopK(ratio=0.5, error_feedback=False)]), torch.tensor([[0.5, 0.2, 0.1, 1.0]]), [7])
    torch.testing.assert_close(plain[0], torch.tensor([0.5, 0.0, 0.0, 1.0]))


def test_none_passes_the_models_and_the_attack_acts_on_what_the_channel_sends():
    models = torch.tensor([[1.0, -2.0, 3.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    assert one_round(Channel(), models, [0, 1]) is models
    got = one_round(Channel([Sign(error_feedback=False)]), models, [0, 1], corrupted=[True, False], attack=SignFlip(0.2))
    assert torch.equal(got, torch.tensor([[-1.5, 1.5, -1.5, 0.0], [0.5, 0.5, 0.5, 0.5]]))


def test_dp_clips_the_rows_and_adds_one_noise_vector_of_the_stated_deviation_to_the_mean():
    dp = DP(noise_multiplier=1.0, clip=1.0)
    u = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    rows, mean = release(dp, u, torch.Generator().manual_seed(3))
    # clipped to ‖·‖ = 1, the short one untouched, no noise on the rows
    torch.testing.assert_close(rows, torch.tensor([[0.6, 0.8], [0.3, 0.4]]), rtol=0, atol=1e-7)
    k, p = 4, 40000
    _, big = release(DP(noise_multiplier=2.0, clip=0.5), torch.zeros(k, p), torch.Generator().manual_seed(4))
    sd = 2.0 * 0.5 / k
    assert abs(float(big.std()) - sd) < 5 * sd / math.sqrt(2 * p)  # z S / K, within 5 standard errors


def test_adaptive_clipping_follows_the_clipped_share():
    dp = DP(noise_multiplier=1.0, clip=1.0, adaptive=True, target_quantile=0.25, count_noise=1e-4)
    release(dp, torch.tensor([[0.5, 0.0], [2.0, 0.0], [3.0, 0.0], [0.9, 0.0]]), G)  # 2 of 4 within S
    assert dp.clip == pytest.approx(math.exp(-0.2 * (0.5 - 0.25)), rel=1e-4)  # the count noise: sd 0.2 * 1e-4 / 4
    assert dp.metrics()["dp_clip"] == 1.0  # the bound this round used
    assert DP(adaptive=True, count_noise=2.0).effective_multiplier(10) == pytest.approx((1 + 0.25) ** -0.5)


def test_accountant_epsilon():
    # without subsampling, RDP of T Gaussians is α T / (2 z²); the library converts it to (ε, δ) as Balle et al. 2020
    z, t, delta = 2.0, 10, 1e-5
    alphas = np.linspace(1.01, 200, 200000)
    hand = np.min(alphas * t / (2 * z**2) + np.log((alphas - 1) / alphas) - (np.log(delta) + np.log(alphas)) / (alphas - 1))
    assert hand <= epsilon(1.0, z, t, delta) <= 1.02 * hand
    # Abadi et al. 2016 (q = 0.01, σ = 4, 10,000 steps, δ = 1e-5): ε = 1.26 by the moments accountant; RDP is tighter
    assert 0.9 < epsilon(0.01, 4.0, 10000, 1e-5) < 1.26
    assert epsilon(0.1, 1.0, 0, 1e-5) == 0.0 and epsilon(0.1, 0.0, 3, 1e-5) == math.inf


def test_dp_is_refused_with_a_rule_that_is_not_a_fixed_weighted_mean():
    with pytest.raises(ValueError, match=r"^channel=dp is not allowed with aggregator Krum: its rule is not a weighted"):
        DP().check(Setup(100, 10, rule=describe(Krum())))
    with pytest.raises(ValueError, match=r"^aggregator.weighting=samples is not allowed with channel=dp"):
        DP().check(Setup(100, 10, rule=describe(FedAvg())))
    dp = DP()
    dp.check(Setup(100, 10, rule=describe(FedAvg(weighting="uniform"))))
    assert dp.rate == 0.1 and dp.delta == pytest.approx(100**-1.1)


@pytest.mark.slow  # a whole run in process, about 10 s
def test_a_composed_channel_runs_and_reports_bits_and_epsilon(tmp_path):
    from fedagg import run_experiment

    summary = run_experiment(["channel=[topk,dp]", "aggregator.weighting=uniform", "rounds=2"], tmp_path / "run")
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    cols = [dict(zip(header, r.split(","))) for r in rows[1:]]
    # the digits MLP has P = 4810 and no buffers: 10 clients · ⌈0.01 P⌉ = 49 entries · (32 + ⌈log2 P⌉ = 13) bits
    assert [c["bits_up"] for c in cols] == ["22050", "22050"] and cols[1]["bits_up_total"] == "44100"
    eps = [float(c["dp_epsilon"]) for c in cols]
    assert 0 < eps[0] < eps[1] and summary["final_dp_epsilon"] == pytest.approx(eps[1])
    assert eps[1] == pytest.approx(epsilon(1.0, 1.0, 2, 10**-1.1))  # every client each round: q = 1, δ = 1/N^1.1
    with pytest.raises(ValueError, match=r"^channel=dp is not allowed with aggregator=krum"):
        run_experiment(["channel=dp", "aggregator=krum", "rounds=1"], tmp_path / "refused")
    assert not (tmp_path / "refused" / "metrics.csv").exists()


@pytest.mark.parametrize("options, stage", [
    ({"compressor": "sign"}, lambda: Sign()),
    ({"compressor": "topk", "ratio": 0.25}, lambda: TopK(ratio=0.25, rounding="floor")),  # 7.5 of 30: 7
])
def test_fedcams_is_fedams_after_the_channel_with_error_feedback(options, stage):
    # rounds 1 and 2 with other clients (5 is new, 1 keeps its e_k), and uneven samples
    rounds = [([0, 1, 2], [4, 2, 2]), ([5, 1], [1, 3])]
    gen = torch.Generator().manual_seed(3)
    w = w_fedcams = w_channel = torch.randn(30, generator=gen)
    fedcams, fedams, channel = FedCAMS(**options), FedAMS(), Channel([stage()])
    for r, (ids, samples) in enumerate(rounds, start=1):
        deltas = torch.randn(len(ids), 30, generator=gen)
        n, i = torch.tensor(samples), torch.tensor(ids)
        w_fedcams = through_channel(fedcams, RoundInputs.of(w_fedcams, w_fedcams + deltas, num_samples=n,
                                                             client_ids=i, round=r)).params
        sent = one_round(channel, w_channel + deltas, ids, global_params=w_channel, r=r)
        w_channel = fedams.aggregate(RoundInputs.of(w_channel, sent, num_samples=n, client_ids=i, round=r)).params
        # FedCAMS's compression is the channel's stage: the same operations in the same order
        assert torch.equal(w_channel, w_fedcams)
        assert not torch.allclose(w_fedcams, w, atol=1e-2)  # it moved
        w = w_fedcams
    errors = fedcams.feedback.memory
    assert set(errors.rows) == {0, 1, 2, 5}
    for i in errors.rows:
        assert torch.equal(channel.stages[0].memory.get(i, w), errors.get(i, w))
    assert fedcams.bits(4810).up == channel.bits_up(4810) and fedcams.bits(30).up == channel.bits_up(30)


def test_fedcams_runs_as_fedams_with_the_channel_compressing_after_the_attack(tmp_path):
    from fedagg import run_experiment

    common = ["rounds=2", "device=cpu", "attack=sign_flip", "aggregator.lr=0.1"]
    run_experiment([*common, "aggregator=fedcams"], tmp_path / "fedcams")
    run_experiment([*common, "aggregator=fedams", "channel=[attack,sign]"], tmp_path / "fedams")
    cams, ams = _rows(tmp_path / "fedcams" / "metrics.csv"), _rows(tmp_path / "fedams" / "metrics.csv")
    assert [{k: v for k, v in r.items() if k != "agg_error_norm"} for r in cams] == ams
    assert all(float(r["agg_error_norm"]) > 0 for r in cams)
    a, b = torch.load(tmp_path / "fedcams" / "model.pt"), torch.load(tmp_path / "fedams" / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def _rows(path):
    with open(path) as f:
        return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in csv.DictReader(f)]


class FedCAMSStopInRound2(StopInRound2, FedCAMS):
    """FedCAMS, stopped the same way."""


@pytest.mark.parametrize("overrides, errors_at, folder", [
    (["channel=topk", "channel.topk.ratio=0.05", "aggregator._target_=stopping.StopInRound2"],
     lambda ckpt: ckpt["channel"]["stages"][0]["errors"], "channel_0_errors"),
    pytest.param(["aggregator=fedcams", "aggregator.compressor=topk", f"aggregator._target_={__name__}.FedCAMSStopInRound2"],
                 lambda ckpt: ckpt["channel"]["stages"][0]["errors"], "channel_0_errors", marks=pytest.mark.slow),
], ids=["channel_topk", "fedcams_topk"])
def test_error_feedback_resumes_exactly_from_a_checkpoint_with_its_rows_in_files(tmp_path, monkeypatch, overrides,
                                                                                errors_at, folder):
    # a zero budget sends every client's e_k but the latest to files: the checkpoint refers to them by version
    monkeypatch.setattr("fedagg.clients.store.MEMORY_BUDGET", 0)
    overrides = ["rounds=4", "device=cpu", "checkpoint_every=1", *overrides]
    reference = train(compose_config(*overrides), tmp_path / "reference")
    run = tmp_path / "run"
    stopped = stopped_in_round_2(train, compose_config(*overrides), run)
    assert stopped["status"] == "interrupted" and stopped["rounds_completed"] == 2
    errors = errors_at(torch.load(run / "checkpoint.pt", weights_only=False))
    # every e_k but the most recently used sits in the run's folder; the checkpoint names its file
    assert len(errors["files"]) >= 2 and len(errors["inline"]) == 1
    assert (run / "client_state" / folder).is_dir()
    resumed = train(compose_config(*overrides, "resume=true"), run)
    assert resumed["status"] == "completed" and resumed["final_test_acc"] == reference["final_test_acc"]
    assert _rows(run / "metrics.csv") == _rows(tmp_path / "reference" / "metrics.csv")
    a, b = torch.load(run / "model.pt"), torch.load(tmp_path / "reference" / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same operations in the same order: bit for bit


def test_error_memories_load_checkpoints_written_before_the_store():
    old = {3: torch.tensor([1.0, -2.0]), 8: torch.tensor([0.5, 0.0])}  # {client id: e_k}, as pickled before
    channel = Channel([Sign()])
    channel.load_state_dict({"stages": [{}], "errors": [old]})
    assert torch.equal(channel.stages[0].memory.get(3, torch.zeros(2)), torch.tensor([1.0, -2.0]))
    assert torch.equal(channel.stages[0].memory.get(4, torch.zeros(2)), torch.zeros(2))  # never seen: zeros
    fedcams = FedCAMS()  # before the chain, FedCAMS kept its e_k itself: they move to its stage
    fedcams.load_state_dict({**fedcams.state_dict(), "errors": old})
    errors = fedcams.feedback.memory
    assert sorted(errors.rows) == [3, 8] and torch.equal(errors.get(8, torch.zeros(2)), torch.tensor([0.5, 0.0]))
