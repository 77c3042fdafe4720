"""The channel composes as written or is refused in one line; bits count what is really sent; DP as the README has it."""

import csv
import json
import logging
import subprocess
import sys

import pytest

from conftest import ROOT
from fedagg import run_experiment
from fedagg.aggregators.fedams import FedCAMS
from fedagg.channel import DP, QSGD, Channel, Setup, TopK
from fedagg.loop.assembly import describe
from fedagg.run import SetupError, explain_composition_error

OPTIONS = "attack, dp, none, qsgd, randk, sign, topk"


def refused(tmp_path, *overrides):
    """The one line a run with these overrides is refused with, before round 1."""
    folder = tmp_path / f"refused{len(list(tmp_path.glob('refused*')))}"
    with pytest.raises(SetupError) as err:
        run_experiment(["rounds=1", "device=cpu", *overrides], folder)
    assert "\n" not in str(err.value)
    assert not (folder / "metrics.csv").exists()
    return str(err.value)


def test_a_compressor_after_dp_is_refused_saying_the_order_that_runs(tmp_path):
    line = ("channel=[dp,topk] is not allowed: topk after dp would change the clipped updates dp's noise is scaled "
            "for; write channel=[topk,dp]")
    assert refused(tmp_path, "channel=[dp,topk]", "aggregator.weighting=uniform") == line
    with pytest.raises(ValueError) as err:
        Channel([DP(), TopK()])  # from Python alike
    assert str(err.value) == line


def test_a_stage_listed_twice_is_refused(tmp_path):
    assert refused(tmp_path, "channel=[topk,topk]") == ("channel=[topk,topk] is not allowed: it lists topk twice, and "
                                                        "a stage runs once; list each stage once")


def test_an_empty_list_is_refused(tmp_path):
    assert refused(tmp_path, "channel=[]") == ("channel=[] is not allowed; an empty list chooses no channel option: "
                                               "choose channel=none for no stage, or stages in a list, e.g. "
                                               "channel=[topk,dp]")


OWN_ZIP = ("; an option of your own needs its folder searched: channel/zip.yaml in DIR and hydra.searchpath=[file://DIR] "
           "on the command line")


@pytest.mark.parametrize("argv, line", [
    (["channel=[topk,zip]"], f"channel=[topk,zip] is not allowed: zip is not a channel option (options: {OPTIONS}){OWN_ZIP}"),
    (["channel=[topk,Sign]"],
     f"channel=[topk,Sign] is not allowed: Sign is not a channel option; did you mean sign? (options: {OPTIONS})"),
    (["-m", "channel=none,[topk,zip]"],
     f"channel=[topk,zip] is not allowed: zip is not a channel option (options: {OPTIONS}){OWN_ZIP}"),
])
def test_an_unknown_name_inside_a_channel_list_is_one_line(argv, line):
    assert explain_composition_error(argv) == line


def test_a_sweep_may_list_channels():
    assert explain_composition_error(["-m", "channel=none,[topk,dp]", "rounds=1"]) is None


def test_qsgd_levels_must_be_an_integer(tmp_path):
    assert refused(tmp_path, "channel=qsgd", "channel.qsgd.levels=2.5") == (
        "channel.qsgd.levels=2.5 is not allowed; it must be an integer")
    with pytest.raises(ValueError, match=r"^channel\.qsgd\.levels=2\.5 is not allowed; it must be an integer >= 1$"):
        QSGD(levels=2.5)


def test_scaffolds_variates_are_counted_beside_the_compressed_model(tmp_path):
    run_experiment(["rounds=1", "device=cpu", "aggregator=scaffold", "channel=topk"], tmp_path / "run")
    with open(tmp_path / "run" / "metrics.csv") as f:
        row = next(csv.DictReader(f))
    # digits' MLP: P = 4810, no buffers; each of 10 clients sends ⌈0.01 P⌉ = 49 entries of 32 + 13 bits, and Δc dense
    assert int(row["bits_up"]) == 10 * (49 * (32 + 13) + 32 * 4810)


def test_fedcams_is_refused_under_a_compressing_channel_and_with_dp_in_the_users_words(tmp_path):
    assert refused(tmp_path, "aggregator=fedcams", "channel=topk") == (
        "channel=topk is not allowed with aggregator=fedcams: it compresses every upload itself, so they would be "
        "compressed twice; use aggregator=fedams channel=topk to compress once, in the channel, or channel=none")
    assert refused(tmp_path, "aggregator=fedcams", "channel=dp") == (
        "channel=dp is not allowed with aggregator=fedcams: it compresses each update after dp has clipped it and "
        "added the noise, which must reach the mean unchanged; aggregator=fedams channel=[sign,dp] compresses before dp")
    assert refused(tmp_path, "aggregator=krum", "channel=dp").startswith(
        "channel=dp is not allowed with aggregator=krum: its rule is not a weighted mean")
    with pytest.raises(ValueError, match=r"^channel=topk is not allowed with aggregator FedCAMS: "):
        Channel([TopK()]).check(Setup(10, 10, rule=describe(FedCAMS())))  # from Python: the class is named


def test_dp_takes_the_uniform_mean_unless_the_user_chose_a_weighting(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    summary = run_experiment(["rounds=1", "device=cpu", "channel=dp"], tmp_path / "run")
    assert summary["status"] == "completed" and summary["config"]["aggregator"]["weighting"] == "uniform"
    assert [m for m in caplog.messages if "aggregator.weighting" in m] == [
        "channel=dp: aggregator.weighting=uniform, the mean its noise is scaled for (the aggregator's default, samples, "
        "is refused with dp)"]
    assert refused(tmp_path, "channel=dp", "aggregator.weighting=samples") == (
        "aggregator.weighting=samples is not allowed with channel=dp: the noise is scaled for the uniform mean; "
        "set aggregator.weighting=uniform")


def test_a_sweep_over_channel_lists_runs_each_as_written(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedagg.run", "-m", "channel=none,[topk,dp]", "rounds=1",
                           "device=cpu", f"hydra.sweep.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    summaries = [json.loads((tmp_path / str(i) / "summary.json").read_text()) for i in (0, 1)]
    assert [s["choices"]["channel"] for s in summaries] == ["none", "[topk,dp]"]
    assert list(summaries[1]["config"]["channel"]) == ["_target_", "topk", "dp"]
    with open(tmp_path / "1" / "metrics.csv") as f:
        row = next(csv.DictReader(f))
    assert int(row["bits_up"]) == 10 * 49 * (32 + 13)  # top-k's count; dp sends what it gets
    assert float(row["dp_epsilon"]) == pytest.approx(1.7930187305713972, rel=1e-9)  # q = 1, z = 1, δ = 10^-1.1
