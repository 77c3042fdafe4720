"""channel=dp's ε in every setting: each round its own event, against dp-accounting composed by hand round by round."""

import csv
import json
import logging
import math
import warnings

import pytest
import torch

pytest.importorskip("dp_accounting", reason="dp-accounting not installed (pip install 'fedagg[dp]')")

from dp_accounting import dp_event  # noqa: E402
from dp_accounting.rdp import RdpAccountant  # noqa: E402

from conftest import compose_config  # noqa: E402
from stopping import stopped_in_round_2  # noqa: E402
from uploads import release  # noqa: E402
from fedagg import run_experiment  # noqa: E402
from fedagg.aggregators.base import FedAvg  # noqa: E402
from fedagg.channel import DP, Setup  # noqa: E402
from fedagg.channel.privacy import HIGHEST_CLIP, LOWEST_CLIP  # noqa: E402
from fedagg.loop.assembly import describe  # noqa: E402
from fedagg.results.runs import read_run  # noqa: E402
from fedagg.run import SetupError, train  # noqa: E402
from fedagg.system.availability import Availability  # noqa: E402

DELTA = 10**-1.1  # 1 / N^1.1 with the default 10 clients
DP_RUN = ["channel=dp", "aggregator.weighting=uniform", "device=cpu"]


def by_hand(events, delta=DELTA):
    """ε after each round: dp-accounting's RdpAccountant, one Poisson-subsampled Gaussian composed per round."""
    accountant, out = RdpAccountant(), []
    for q, z in events:
        accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)))
        out.append(accountant.get_epsilon(delta))
    return out


def adaptive_multiplier(k, z=1.0):
    """The update's and the clipped count's noise (σ_b = K/20) as one Gaussian: (z⁻² + σ_b⁻²)^(-1/2)."""
    return (z**-2 + (k / 20) ** -2) ** -0.5


def rows(run):
    with open(run / "metrics.csv") as f:
        return list(csv.DictReader(f))


def epsilons(run):
    return [float(r["dp_epsilon"]) for r in rows(run)]


def test_adaptive_clipping_with_a_varying_number_of_reporters_composes_each_rounds_own_event(tmp_path):
    run = tmp_path / "run"
    run_experiment([*DP_RUN, "rounds=4", "channel.dp.adaptive=true", "system=dropout", "system.p=0.5"], run)
    reporters = [int(r["clients"]) for r in rows(run)]
    assert len(set(reporters)) > 1 and 0 not in reporters  # K varies from round to round
    want = by_hand([(1.0, adaptive_multiplier(k)) for k in reporters])  # every client sampled: q = 1
    assert epsilons(run) == pytest.approx(want, rel=1e-9)
    assert all(a < b for a, b in zip(want, want[1:]))


@pytest.mark.parametrize("per_round, q", [("null", 1.0), ("2", 0.4)])  # 5 of the 10 clients can be sampled
def test_held_out_clients_are_not_counted_in_the_sampling_rate(tmp_path, per_round, q):
    run = tmp_path / "run"
    run_experiment([*DP_RUN, "rounds=2", "eval.held_out_clients=0.5", f"clients_per_round={per_round}"], run)
    want = by_hand([(q, 1.0)] * 2)  # δ stays 1 / N^1.1 over all 10 clients
    assert epsilons(run) == pytest.approx(want, rel=1e-9)
    if q == 1.0:
        assert want == pytest.approx([1.7930187, 3.0370970], rel=1e-6)


def test_with_clients_offline_each_round_counts_k_over_the_clients_online_then(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    run = tmp_path / "run"
    run_experiment([*DP_RUN, "rounds=3", "system=availability", "clients_per_round=3"], run)
    online = [int(Availability().online(0, r, 10).sum()) for r in (1, 2, 3)]
    assert all(n > 3 for n in online) and len(set(online)) > 1
    assert epsilons(run) == pytest.approx(by_hand([(3 / n, 1.0) for n in online]), rel=1e-9)
    said = [r.getMessage() for r in caplog.records if "clients go offline" in r.getMessage()]
    assert said == ["channel=dp: clients go offline, so each round's ε counts q = min(1, K / the clients online that "
                    "round), the chance an online client is sampled, an upper bound for every client"]


def test_no_noise_is_an_infinite_epsilon_in_csv_and_valid_json_read_back_as_inf(tmp_path):
    run = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_experiment([*DP_RUN, "rounds=2", "channel.dp.noise_multiplier=0"], run)
    assert [r["dp_epsilon"] for r in rows(run)] == ["inf", "inf"]

    def refuse(token):
        raise AssertionError(f"summary.json holds {token}, which JSON does not have")

    summary = json.loads((run / "summary.json").read_text(), parse_constant=refuse)
    assert summary["final_dp_epsilon"] is None and summary["final_dp_epsilon_infinite"] is True
    assert read_run(run)["final_dp_epsilon"] == math.inf
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in caught]


@pytest.mark.parametrize("setting", [
    ["system=dropout", "system.p=0.5", "channel.dp.adaptive=true"],
    ["clients_per_round=5", "channel.dp.adaptive=true"],
    ["eval.held_out_clients=0.3", "clients_per_round=3", "channel.dp.adaptive=true"],
    ["system=availability", "clients_per_round=3", "channel.dp.adaptive=true"],
    ["system=stragglers", "channel.dp.adaptive=true"],
    ["channel.dp.noise_multiplier=0"],
], ids=["dropout", "subsampled", "held_out", "availability", "stragglers", "no_noise"])
def test_epsilon_never_falls(tmp_path, setting):
    run = tmp_path / "run"
    run_experiment([*DP_RUN, "rounds=4", *setting], run)
    eps = [float(r["dp_epsilon"]) for r in rows(run) if r["dp_epsilon"]]
    assert len(eps) == 4 and eps[0] > 0
    assert all(a <= b for a, b in zip(eps, eps[1:])), eps


def test_a_resumed_run_continues_the_accountant_exactly(tmp_path):
    overrides = [*DP_RUN, "rounds=4", "checkpoint_every=1", "channel.dp.adaptive=true", "system=dropout",
                 "system.p=0.5", "aggregator._target_=stopping.StopInRound2"]
    train(compose_config(*overrides), tmp_path / "reference")
    run = tmp_path / "run"
    assert stopped_in_round_2(train, compose_config(*overrides), run)["status"] == "interrupted"
    kept = torch.load(run / "checkpoint.pt", weights_only=False)["channel"]["stages"][0]
    assert len(kept["events"]) == 2
    train(compose_config(*overrides, "resume=true"), run)
    assert [r["dp_epsilon"] for r in rows(run)] == [r["dp_epsilon"] for r in rows(tmp_path / "reference")]
    assert [r["dp_clip"] for r in rows(run)] == [r["dp_clip"] for r in rows(tmp_path / "reference")]


def test_a_checkpoint_from_before_the_events_counts_its_rounds_as_the_configured_event():
    dp = DP(adaptive=True)
    dp.check(Setup(10, 5, rule=describe(FedAvg(weighting="uniform"))))
    dp.load_state_dict({"clip": 0.8, "rounds": 3})  # all such a checkpoint kept
    assert dp.clip == 0.8 and dp.rounds == 3
    old = (0.5, adaptive_multiplier(5))
    assert dp.accountant.epsilon(dp.delta) == pytest.approx(by_hand([old] * 3)[-1], rel=1e-9)
    release(dp, torch.ones(4, 3), torch.Generator().manual_seed(0), 0.5)  # a round with 4 reporters
    assert dp.metrics()["dp_epsilon"] == pytest.approx(by_hand([old] * 3 + [(0.5, adaptive_multiplier(4))])[-1],
                                                       rel=1e-9)


def test_adaptive_clipping_says_at_start_how_much_the_count_adds_and_the_accountant_stays_quiet(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    run_experiment([*DP_RUN, "rounds=2", "clients_per_round=5", "channel.dp.adaptive=true"], tmp_path / "run")
    alone, with_count = by_hand([(0.5, 1.0)])[0], by_hand([(0.5, adaptive_multiplier(5))])[0]
    assert with_count > 8 * alone  # the default σ_b = K/20 = 0.25 at K = 5
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("channel.dp.adaptive=true")]
    assert said == [f"channel.dp.adaptive=true: the clipped count (count_noise=null: K/20 = 0.25) is released too, so "
                    f"one round at K=5 gives ε={with_count:.4g} where the update alone gives {alone:.4g} "
                    f"({with_count / alone:.1f}x); a larger channel.dp.count_noise costs less"]
    assert not [r for r in caplog.records if r.name == "absl"]  # q = 0.5: 8 non-converging orders a round


@pytest.mark.parametrize("setting, line", [
    ("channel.dp.noise_multiplier=1e300", "channel.dp.noise_multiplier=1e300 is not allowed; use 0 (no noise: ε = ∞) "
                                          "or a number in [0.0001, 10000]"),
    ("channel.dp.count_noise=1e-200", "channel.dp.count_noise=1e-200 is not allowed; use a number in [0.0001, 10000], "
                                      "or null for K/20"),
    ("channel.dp.clip_lr=1e6", "channel.dp.clip_lr=1e6 is not allowed; it must be a number in (0, 10]"),
])
def test_values_that_break_the_mathematics_are_refused_before_round_1(tmp_path, setting, line):
    with pytest.raises(SetupError) as err:
        run_experiment([*DP_RUN, "rounds=1", "channel.dp.adaptive=true", setting], tmp_path / "run")
    assert str(err.value).startswith(line) and "\n" not in str(err.value)
    assert not (tmp_path / "run" / "metrics.csv").exists()


def test_the_adaptive_bound_stays_a_positive_number_whatever_the_noisy_count_says():
    # the widest settings allowed: a count noise of 10^4 at K = 1 moves b by thousands, exp(10 * that) overflows
    dp = DP(adaptive=True, count_noise=1e4, clip_lr=10.0)
    dp.check(Setup(10, 1, rule=describe(FedAvg(weighting="uniform"))))
    g = torch.Generator().manual_seed(0)
    clips = []
    for _ in range(20):
        release(dp, torch.ones(1, 3), g, 0.1)
        clips.append(dp.clip)
    assert all(LOWEST_CLIP <= c <= HIGHEST_CLIP for c in clips)
    assert {LOWEST_CLIP, HIGHEST_CLIP} & set(clips)  # it reached a bound rather than 0 or inf
