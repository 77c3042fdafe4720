"""Bits sent per round (metrics.csv bits_down/bits_up and their totals) against hand counts."""

import csv
import shutil

import torch
from torch import nn

from conftest import compose_config
from fedagg.aggregators.base import FedAvg
from fedagg.aggregators.fedams import FedCAMS
from fedagg.aggregators.scaffold import Scaffold
from fedagg.loop.communication import BitCounter
from fedagg.models.flat import get_buffers, get_params
from fedagg.results import plots as plot
from fedagg.run import train
from results_runs import fake_run


def test_bits_per_round_for_fedavg_scaffold_and_fedcams_against_hand_counts():
    # P = 1000 parameters, B = 3 buffer values; 4 clients sampled, 3 report
    fedavg = BitCounter(FedAvg(), 1000, 3).count(range(4), range(3))
    assert fedavg == {"bits_down": 4 * 32 * 1003, "bits_up": 3 * 32 * 1003,
                      "bits_down_total": 128384, "bits_up_total": 96288}
    scaffold = BitCounter(Scaffold(), 1000, 3).count(range(4), range(3))  # model and control variate, both ways
    assert (scaffold["bits_down"], scaffold["bits_up"]) == (4 * (64000 + 96), 3 * (64000 + 96))
    # top-k, ratio 0.05: 50 entries of 32 bits + a 10-bit index (ceil(log2 1000)); down stays dense
    topk = BitCounter(FedCAMS(compressor="topk", ratio=0.05), 1000, 3).count(range(4), range(3))
    assert (topk["bits_down"], topk["bits_up"]) == (4 * 32096, 3 * (50 * 42 + 96))
    # ratio 1/64 of 1000 is 15.6: the compressor keeps 15 entries, and 15 are counted
    assert BitCounter(FedCAMS(compressor="topk"), 1000, 0).count(range(1), range(1))["bits_up"] == 15 * 42
    sign = BitCounter(FedCAMS(compressor="sign"), 1000, 3).count(range(4), range(3))  # one bit per entry and the scale
    assert sign["bits_up"] == 3 * (1000 + 32 + 96)


def test_totals_run_over_rounds_and_count_batchnorm_buffers():
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))  # 3*2 + 2 weights and biases, 2 + 2 affine
    p, b = get_params(model).numel(), get_buffers(model).numel()
    assert (p, b) == (12, 5)  # running mean and variance, and num_batches_tracked
    counter = BitCounter(FedAvg(), p, b)
    counter.count(range(5), range(5))
    second = counter.count(range(5), range(2))  # three dropped out: they were sent the model but sent nothing back
    assert second == {"bits_down": 5 * 544, "bits_up": 2 * 544, "bits_down_total": 10 * 544, "bits_up_total": 7 * 544}
    restored = BitCounter(FedAvg(), p, b)
    restored.load_state_dict(counter.state_dict())
    assert restored.count(range(1), range(1))["bits_up_total"] == 8 * 544


def _rows(path):
    with open(path, newline="") as f:
        return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in csv.DictReader(f)]


def test_a_run_counts_every_round_and_resumes_its_totals(tmp_path):
    # digits MLP: P = 64*64 + 64 + 64*10 + 10 = 4810, no buffers. FedCAMS top-k (1/64) uploads 75 entries of
    # 32 + 13 bits; 4 of 10 clients are sampled a round and half of them drop out
    overrides = ["device=cpu", "rounds=4", "eval_every=3", "checkpoint_every=2", "clients_per_round=4",
                 "system=dropout", "system.p=0.5", "aggregator=fedcams", "aggregator.compressor=topk"]
    run = tmp_path / "run"
    train(compose_config(*overrides), run, choices={"aggregator": "fedcams"})
    rows = _rows(run / "metrics.csv")
    reported = [sum(1 for w in _rows(run / "weights.csv") if int(w["round"]) == r) for r in range(1, 5)]
    assert sum(reported) < 16  # dropouts happened, or the test would not tell sampled from reported
    assert [int(r["round"]) for r in rows] == [3, 4]  # rounds 1 and 2 have no row, but count in the totals
    for row in rows:
        r = int(row["round"])
        assert int(row["bits_down"]) == 4 * 32 * 4810
        assert int(row["bits_up"]) == reported[r - 1] * 75 * 45
        assert int(row["bits_down_total"]) == r * 4 * 32 * 4810
        assert int(row["bits_up_total"]) == sum(reported[:r]) * 75 * 45
    # resumed after round 2 (the checkpoint before the last): the totals come from the checkpoint, not from rows
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    shutil.move(resumed / "checkpoint.prev.pt", resumed / "checkpoint.pt")
    assert torch.load(resumed / "checkpoint.pt", weights_only=False)["round"] == 2
    (resumed / "summary.json").unlink()
    (resumed / "metrics.csv").unlink()
    train(compose_config(*overrides, "resume=true"), resumed, choices={"aggregator": "fedcams"})
    assert _rows(resumed / "metrics.csv") == rows


def test_plot_draws_accuracy_against_the_cumulative_bits(tmp_path, monkeypatch):
    sweep = tmp_path / "sweep"
    # seed 1 lost clients: it uploaded less. Rows at the evaluated rounds 2 and 4 only
    for method, per_round in (("fedavg", 1000), ("fedcams", 10)):
        for seed, up_share in ((0, 1.0), (1, 0.8)):
            metrics = [{"round": r, "test_acc": 0.5 + 0.1 * r + 0.1 * seed, "bits_up": 0, "bits_down": 0,
                        "bits_up_total": int(up_share * per_round * r), "bits_down_total": 1000 * r} for r in (2, 4)]
            fake_run(sweep / f"{method}{seed}", seed=seed, choices={"aggregator": method}, metrics=metrics)
    figures = []
    monkeypatch.setattr(plot.plt, "close", figures.append)  # keep the figures to read back what was drawn
    assert plot.main([str(sweep), "--wandb-mode", "disabled"]) == 0
    assert (sweep / "accuracy_bits.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    drawn = [f for f in figures if "bits" in f.axes[0].get_xlabel()]
    assert len(drawn) == 1
    uploaded, both = drawn[0].axes
    assert uploaded.get_xlabel() == "cumulative bits uploaded (log scale)" and uploaded.get_xscale() == "log"
    lines = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in uploaded.lines}
    assert set(lines) == {"fedavg", "fedcams"}
    # x: the mean over seeds of bits_up_total, (1000 r + 800 r) / 2; y: the mean accuracy in %
    torch.testing.assert_close(lines["fedavg"][0], [1800.0, 3600.0])
    torch.testing.assert_close(lines["fedcams"][0], [18.0, 36.0])
    torch.testing.assert_close(lines["fedavg"][1], [75.0, 95.0])
    both_lines = {ln.get_label(): list(ln.get_xdata()) for ln in both.lines}
    torch.testing.assert_close(both_lines["fedcams"], [2018.0, 4036.0])  # uploads plus 1000 r sent down


def test_plot_of_runs_without_bit_counts_draws_the_rest(tmp_path, capsys):
    fake_run(tmp_path / "sweep" / "old", metrics=[{"round": 1, "test_acc": 0.5}])
    assert plot.main([str(tmp_path / "sweep"), "--wandb-mode", "disabled"]) == 0
    assert not (tmp_path / "sweep" / "accuracy_bits.png").exists()
    assert capsys.readouterr().out.splitlines() == [str(tmp_path / "sweep" / name) for name in
                                                    ("accuracy.png", "update_norms.png", "weights.png")]
