"""A setting that is legal but does nothing in the run it is given to says so in one line at the start, once; the
same setting where it acts says nothing."""

import logging
import subprocess
import sys

import pytest
from hydra.utils import instantiate

from conftest import ROOT, compose_config
from fedagg.aggregators.fedasync import FedAsync
from fedagg.aggregators.fedbuff import FedBuff
from fedagg.aggregators.fedopt import FedAdam
from fedagg.clients.moon import MOON
from fedagg.sampling.base import Sampler
from fedagg.sampling.clustered import Clustered
from fedagg.sampling.power_of_choice import PowerOfChoice
from fedagg.sampling.size import SizeProportional
from fedagg.system.clock import LogNormal


def notes(caplog, check) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fedagg"):
        check()
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def cli(*args, tmp_path):
    done = subprocess.run([sys.executable, "-m", "fedagg.run", "dataset=digits", "rounds=1", "device=cpu", "num_clients=4",
                           *args, f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return [line.split("[WARNING] - ", 1)[1] for line in (done.stdout + done.stderr).splitlines() if "[WARNING] - " in line]


def test_a_synchronous_run_notes_each_setting_that_does_nothing_once(tmp_path):
    said = cli("clock=lognormal", "clock.deadline=1e6", "clock.over_select=0.3", "sampler=size", "aggregator=fedadam",
               "aggregator.correction=rate", "client/objective=moon", "client.objective.projection=none",
               "client.objective.projection_dim=8", tmp_path=tmp_path)
    assert sorted(said) == sorted([
        "aggregator.correction=rate does nothing with aggregator.bias_correction=false: the two corrections differ "
        "only in where they correct the bias; set aggregator.bias_correction=true for the FedOpt authors' Keras form",
        "sampler=size does nothing here: clients_per_round covers all 4 clients that can train, so each one is sent "
        "every round, as under any sampler",
        "clock.over_select=0.3 does nothing: clients_per_round already sends all 4 clients that can train each round, "
        "so no extra one can be sampled; over-selection needs clients_per_round below them",
        "client.objective.projection_dim=8 does nothing with client.objective.projection=none: the representation is "
        "the backbone's own; projection=head puts a head of that width under the classifier",
    ]), said


def test_an_asynchronous_run_notes_fedbuffs_unread_options_and_a_sampler_with_nobody_to_choose(tmp_path):
    said = cli("server=async", "clock=lognormal", "aggregator=fedbuff", "aggregator.buffer_size=2", "server.concurrency=4",
               "aggregator.momentum=0.9", "sampler=power_of_choice", tmp_path=tmp_path)
    assert sorted(said) == sorted([
        "aggregator.momentum=0.9 does nothing with aggregator.optimizer=sgd (momentum is read by optimizer=avgm)",
        "sampler=power_of_choice does nothing here: server.concurrency covers all 4 clients that can train, so each "
        "one is sent again as soon as it arrives, as under any sampler",
    ]), said


def test_over_selection_capped_at_the_clients_that_can_train_is_noted(caplog):
    clock = LogNormal(deadline=60.0, over_select=1e9)
    assert notes(caplog, lambda: clock.check(10, 50)) == [
        "clock.over_select=1e+09 asks for ceil((1 + 1e+09) x 10) = 10000000010 clients a round, but only 50 can train: "
        "a round samples all 50 (clock.over_select=4 already samples them all)"]
    # where it adds clients, or is not set: nothing to say
    assert notes(caplog, lambda: LogNormal(deadline=60.0, over_select=0.3).check(10, 50)) == []
    assert notes(caplog, lambda: LogNormal(deadline=60.0, over_select=0.3).check(10, 13)) == []  # ⌈13⌉ = 13 fits
    assert notes(caplog, lambda: LogNormal(deadline=60.0).check(10, 10)) == []


@pytest.mark.parametrize("sampler", [SizeProportional(), PowerOfChoice(), Clustered()])
def test_a_chosen_sampler_is_noted_only_when_it_has_nobody_to_choose_among(caplog, sampler):
    assert len(notes(caplog, lambda: sampler.check(10, 10))) == 1
    assert notes(caplog, lambda: sampler.check(5, 10)) == []
    assert notes(caplog, lambda: Sampler().check(10, 10)) == []  # the default draw: nothing was chosen


def test_optimizer_options_are_noted_only_where_the_optimizer_does_not_read_them(caplog):
    unread = lambda rule: notes(caplog, lambda: rule.check_clients(None))  # noqa: E731
    assert unread(FedBuff(optimizer="adagrad", beta2=0.5, momentum=0.8)) == [
        "aggregator.momentum=0.8 and aggregator.beta2=0.5 do nothing with aggregator.optimizer=adagrad (momentum is "
        "read by optimizer=avgm; beta2 is read by optimizer=adam, yogi)"]
    assert unread(FedBuff(optimizer="avgm", momentum=0.8)) == []
    assert unread(FedBuff(optimizer="adam", beta1=0.5, beta2=0.5, tau=0.1)) == []
    assert unread(FedBuff()) == []  # nothing set: the YAML's nulls
    assert unread(FedAsync(staleness="constant", a=0.5)) == [
        "aggregator.a=0.5 does nothing with aggregator.staleness=constant: s(k) = 1 reads no a; polynomial and hinge do"]
    assert unread(FedAsync(staleness="constant")) == unread(FedAsync(staleness="hinge", a=2.0)) == []
    assert len(unread(FedAdam(correction="rate"))) == 1
    assert unread(FedAdam(correction="rate", bias_correction=True)) == unread(FedAdam()) == []
    assert notes(caplog, lambda: MOON(projection="none", projection_dim=8).setup(None)) != []
    assert notes(caplog, lambda: MOON(projection_dim=8).setup(None)) == notes(caplog, lambda: MOON(projection="none").setup(None)) == []


def test_fedbuff_takes_its_server_optimizers_own_rate():
    # sgd keeps the paper's η_g = 1; an adaptive optimizer moves each coordinate by about lr, so sgd's 1 would
    # make it diverge: it takes FedAdam's 0.01, as aggregator=fedadam does, unless lr is given
    assert FedBuff().lr == 1.0 and FedBuff(optimizer="avgm").server.lr == 1.0
    for optimizer in ("adam", "yogi", "adagrad"):
        rule = instantiate(compose_config("aggregator=fedbuff", f"aggregator.optimizer={optimizer}").aggregator)
        assert rule.server.lr == 0.01 and rule.server.beta1 == 0.9 and rule.server.tau == 1e-3
    assert FedBuff(optimizer="adam", lr=0.3).server.lr == 0.3
    assert FedBuff(optimizer="avgm").server.momentum == 0.9 and FedBuff(optimizer="yogi").server.beta2 == 0.99
    assert MOON().sees.projection_head == 256 and MOON(projection="none").sees.projection_head == 0
