"""The channel is a chain run in list order: client sides in order, server sides on the mean in reverse,
error feedback as a wrapper, the attack as a position, and a stage with a server side fits without
editing the chain."""

import pytest
import torch

from fedagg import RoundInputs, run_experiment
from fedagg.aggregators.base import FedAvg
from fedagg.attacks.base import Attack
from fedagg.channel import AttackPosition, Channel, ErrorFeedback, Stage, TopK
from uploads import upload


class Scale2(Stage):
    def client(self, rows, up, g):
        return rows * 2


class Add1(Stage):
    def client(self, rows, up, g):
        return rows + 1


class ServerScale2(Stage):
    def server(self, mean, up, g):
        return mean * 2


class ServerAdd1(Stage):
    def server(self, mean, up, g):
        return mean + 1


def sent(channel, updates, ids=None, corrupted=None, r=1, attack=None):
    """What the aggregator receives from clients that start at 0 (their models are their updates)."""
    return channel.connect(attack or Attack()).transmit(updates, upload(*updates.shape, ids, corrupted, r=r)).models


def test_client_sides_run_in_list_order():
    u = torch.tensor([[1.0, 2.0]])
    assert torch.equal(sent(Channel([Scale2(), Add1()]), u), torch.tensor([[3.0, 5.0]]))  # (u * 2) + 1
    assert torch.equal(sent(Channel([Add1(), Scale2()]), u), torch.tensor([[4.0, 6.0]]))  # (u + 1) * 2


def test_server_sides_run_on_the_mean_in_reverse_list_order():
    mean = torch.tensor([1.0, -1.0])
    for stages, expected in (([ServerScale2(), ServerAdd1()], [4.0, 0.0]),  # 2 (mean + 1): the last one first
                             ([ServerAdd1(), ServerScale2()], [3.0, -1.0])):  # 2 mean + 1
        arrived = Channel(stages).transmit(torch.zeros(2, 2), upload(2, 2))
        assert arrived.on_mean.needed and not arrived.on_mean.applied
        assert torch.equal(arrived.on_mean(mean), torch.tensor(expected)) and arrived.on_mean.applied
    assert not Channel([Scale2()]).transmit(torch.zeros(1, 2), upload(1, 2)).on_mean.needed


class CyclicK(Stage):
    """Client k sends the k entries of its update at (id + round + j) mod P, unscaled; the server decodes the
    mean by P/k (an unbiased estimate when the places are uniform)."""

    def __init__(self, k):
        self.k = k

    def client(self, rows, up, g):
        p = rows.shape[1]
        keep = torch.tensor([[(i + up.round + j) % p for j in range(self.k)] for i in up.ids])
        return torch.zeros_like(rows).scatter(1, keep, rows.gather(1, keep))

    def server(self, mean, up, g):
        return mean * (mean.numel() / self.k)


def test_a_compressor_that_decodes_on_the_server_fits_the_chain_and_fedavg():
    w = torch.ones(4)
    models = w + torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]])
    arrived = Channel([CyclicK(2)]).transmit(models, upload(2, 4, ids=[0, 1], r=1, start=w))
    # client 0 keeps places 1, 2: (0, 2, 3, 0); client 1 places 2, 3: (0, 0, 2, 1)
    assert torch.equal(arrived.models - w, torch.tensor([[0.0, 2.0, 3.0, 0.0], [0.0, 0.0, 2.0, 1.0]]))
    inputs = RoundInputs.of(w, arrived.models, on_mean=arrived.on_mean)
    out = FedAvg().aggregate(inputs)  # mean (0, 1, 2.5, 0.5), decoded x 4/2 = (0, 2, 5, 1)
    assert torch.equal(out.params, torch.tensor([1.0, 3.0, 6.0, 2.0])) and arrived.on_mean.applied


def test_error_feedback_wraps_a_compressor_and_keeps_memory_by_client_id_over_two_rounds():
    ef = ErrorFeedback(TopK(ratio=0.5, error_feedback=False))  # k = 2 of 4
    channel = Channel([ef])
    first = sent(channel, torch.tensor([[3.0, 1.0, -2.0, 0.5], [1.0, 0.0, 0.0, 0.25]]), ids=[7, 2])
    assert torch.equal(first, torch.tensor([[3.0, 0.0, -2.0, 0.0], [1.0, 0.0, 0.0, 0.25]]))
    assert torch.equal(ef.memory.get(7, torch.zeros(4)), torch.tensor([0.0, 1.0, 0.0, 0.5]))
    assert torch.equal(ef.memory.get(2, torch.zeros(4)), torch.zeros(4))
    saved = channel.state_dict()
    # round 2, the other order: u_7 = e_7 + (0.5, 0.25, 0.125, 1) = (0.5, 1.25, 0.125, 1.5); a new client 4
    second = sent(channel, torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.5, 0.25, 0.125, 1.0], [0.0, 2.0, 0.0, 0.0]]),
                  ids=[2, 7, 4], r=2)
    assert torch.equal(second, torch.tensor([[0.0] * 4, [0.0, 1.25, 0.0, 1.5], [0.0, 2.0, 0.0, 0.0]]))
    assert torch.equal(ef.memory.get(7, torch.zeros(4)), torch.tensor([0.5, 0.0, 0.125, 0.0]))
    assert len(ef.memory) == 3 and list(channel.client_stores()) == ["channel_0_errors"]
    # a checkpoint of the chain, and one written before the wrapper ({"stages", "errors"}), resume the same
    for state in (saved, {"stages": [{}], "errors": [saved["stages"][0]["errors"]]}):
        resumed = Channel([ErrorFeedback(TopK(ratio=0.5, error_feedback=False))])
        resumed.load_state_dict(state)
        again = sent(resumed, torch.tensor([[0.0] * 4, [0.5, 0.25, 0.125, 1.0], [0.0, 2.0, 0.0, 0.0]]), ids=[2, 7, 4],
                     r=2)
        assert torch.equal(again, second)


def test_a_compressor_whose_options_say_error_feedback_is_wrapped_by_the_chain():
    assert isinstance(Channel([TopK()]).stages[0], ErrorFeedback)
    assert isinstance(Channel([TopK(error_feedback=False)]).stages[0], TopK)


class Shift(Attack):
    """Adds 1 to what the corrupted clients send."""

    def corrupt(self, global_params, client_params, corrupted, g):
        return torch.where(corrupted[:, None], client_params + 1, client_params)


def test_the_attack_is_a_position_in_the_chain():
    u = torch.tensor([[3.0, -1.0, 0.5, 0.0], [3.0, -1.0, 0.5, 0.0]])
    corrupted = [True, False]
    # unlisted, after the compressors: top-2 of (3, -1, 0.5, 0) is (3, -1, 0, 0), then shifted
    after = sent(Channel([TopK(ratio=0.5, error_feedback=False)]), u, corrupted=corrupted, attack=Shift())
    assert torch.equal(after, torch.tensor([[4.0, 0.0, 1.0, 1.0], [3.0, -1.0, 0.0, 0.0]]))
    # listed first: the shifted update (4, 0, 1.5, 1) is compressed
    before = sent(Channel([AttackPosition(), TopK(ratio=0.5, error_feedback=False)]), u, corrupted=corrupted,
                  attack=Shift())
    assert torch.equal(before, torch.tensor([[4.0, 0.0, 1.5, 0.0], [3.0, -1.0, 0.0, 0.0]]))


def test_a_compressor_after_a_privatising_stage_is_refused_and_the_attack_may_be_placed_anywhere():
    from fedagg.channel import DP

    with pytest.raises(ValueError, match=r"^channel=\[dp,topk\] is not allowed: topk after dp would change"):
        Channel(dp=DP(), topk=TopK())
    Channel(dp=DP(), attack=AttackPosition())  # attackers that skip clipping: the user's choice
    with pytest.raises(ValueError, match=r"^channel=\[attackposition,topk,attackposition\] is not allowed: it places"):
        Channel([AttackPosition(), TopK(), AttackPosition()])


def test_channel_attack_in_a_list_runs_from_the_command_line(tmp_path):
    summary = run_experiment(["rounds=1", "device=cpu", "channel=[attack,topk]", "attack=sign_flip"], tmp_path / "run")
    assert summary["status"] == "completed" and summary["choices"]["channel"] == "[attack,topk]"


def test_dp_clips_on_the_clients_and_adds_its_seeded_noise_once_to_the_mean():
    from fedagg.channel import DP, Rule, Setup
    from fedagg.seeding import generator

    dp = DP(noise_multiplier=2.0, clip=1.0)
    dp.check(Setup(10, 2, rule=Rule(weighting="uniform", weighted_mean=True)))
    w = torch.tensor([1.0, -1.0, 0.5])
    models = w + torch.tensor([[3.0, 4.0, 0.0], [0.3, 0.0, 0.4]])
    arrived = Channel([dp]).transmit(models, upload(2, 3, ids=[4, 9], r=3, seed=5, start=w))
    rows = arrived.models - w
    torch.testing.assert_close(rows, torch.tensor([[0.6, 0.8, 0.0], [0.3, 0.0, 0.4]]))  # clipped, and no noise
    out = FedAvg(weighting="uniform").aggregate(RoundInputs.of(w, arrived.models, on_mean=arrived.on_mean))
    # the stage's stream (seed 5, stage 0, round 3) draws the noise vector; sd z S / K = 2 * 1 / 2
    noise = torch.randn(3, generator=generator(5, "channel", 0, 3), dtype=torch.float64).float() * 1.0
    assert torch.equal(out.params, w + (torch.tensor([0.5, 0.5]) @ rows + noise))
    assert dp.rounds == 1 and dp.metrics()["dp_clip"] == 1.0


def test_a_server_side_with_a_rule_that_forms_no_mean_is_refused_before_training():
    from fedagg.aggregators.fedopt import FedAdam
    from fedagg.aggregators.krum import Krum
    from fedagg.channel.base import Setup
    from fedagg.loop.assembly import describe

    assert describe(FedAvg()).forms_mean and describe(FedAdam()).forms_mean  # the base step: the mean, then a step
    assert not describe(Krum()).forms_mean  # picks one client's update: no mean for a decoder to act on
    decoder = Channel([CyclicK(2)])
    decoder.check(Setup(10, 5, rule=describe(FedAvg())))
    with pytest.raises(ValueError, match=r"^channel=cyclick is not allowed with aggregator=krum: cyclick acts on the "
                                         r"weighted mean update on the server, which this rule never forms"):
        decoder.check(Setup(10, 5, rule=describe(Krum(), "krum")))
    Channel([TopK()]).check(Setup(10, 5, rule=describe(Krum(), "krum")))  # a client side alone is fine with any rule


def test_a_checkpoint_naming_the_channel_at_its_old_place_resumes_as_the_same_setting():
    from fedagg.run import _changed_keys

    old = {"channel": {"_target_": "fedagg.channel.base.Channel", "topk": {"ratio": 0.01}}, "seed": 0}
    new = {"channel": {"_target_": "fedagg.channel.chain.Channel", "topk": {"ratio": 0.01}}, "seed": 0}
    assert _changed_keys(old, new) == []
    assert _changed_keys(old, {**new, "channel": {**new["channel"], "topk": {"ratio": 0.02}}}) == ["channel.topk.ratio"]
    assert _changed_keys({"channel": {"_target_": "fedagg.channel.base.Stage"}, "seed": 0}, new) == [
        "channel._target_", "channel.topk"]
