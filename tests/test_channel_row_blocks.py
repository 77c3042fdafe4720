"""Row-wise stages (compressors, error feedback: FedCAMS's compression) run on the engine's chunk of rows, so a
round's temporaries are [chunk, P] as an aggregator's are; the blocks give what the whole round gives."""

import pytest
import torch

from fedagg import run_experiment
from fedagg.aggregators.fedams import FedCAMS
from fedagg.attacks.base import Attack
from fedagg.channel import Channel, Stage
from uploads import upload


class Seen(Stage):
    """Records the rows and ids each call of its client side got; `rowwise` as given."""

    def __init__(self, rowwise: bool):
        self.rowwise, self.calls = rowwise, []

    def client(self, rows, up, g):
        self.calls.append((rows.shape[0], up.ids))
        return rows * 2


def test_row_wise_stages_get_blocks_of_the_engines_chunk_and_the_others_the_whole_round():
    rowwise, whole = Seen(True), Seen(False)
    models = torch.arange(10.0).view(5, 2)
    out = Channel([rowwise, whole]).connect(Attack()).transmit(models.clone(), upload(5, 2, ids=[9, 3, 7, 1, 4]),
                                                               block_rows=2).models
    assert rowwise.calls == [(2, (9, 3)), (2, (7, 1)), (1, (4,))]
    assert whole.calls == [(5, (9, 3, 7, 1, 4))]
    assert torch.equal(out, models * 4)


@pytest.mark.parametrize("compressor", ["sign", "topk"])
def test_fedcams_compression_in_blocks_equals_the_whole_round_with_per_client_errors(compressor):
    """Two rounds of FedCAMS's stages (error feedback around sign or top-k) on 5 clients, in blocks of 2 and at
    once: the same models, the same e_k by id, the same mean ‖e_k‖ (agg_error_norm); starts per client (the
    asynchronous server's [K, P]) cut with the rows."""
    g = torch.Generator().manual_seed(0)
    blocked, whole = (Channel().connect(Attack(), FedCAMS(compressor=compressor, ratio=0.25).channel_stages())
                      for _ in range(2))
    for r, ids in ((1, [0, 1, 2, 3, 4]), (2, [3, 0, 4, 5, 1])):
        start = torch.randn(5, 8, dtype=torch.float64, generator=g)
        models = start + torch.randn(5, 8, dtype=torch.float64, generator=g)
        up = upload(5, 8, ids=ids, r=r, start=start)
        a = blocked.transmit(models.clone(), up, block_rows=2).models
        b = whole.transmit(models.clone(), up).models
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
        fa, fb = blocked.rule_stages[0], whole.rule_stages[0]
        assert fa.held_back == pytest.approx(fb.held_back, rel=1e-12)
        for i in ids:
            torch.testing.assert_close(fa.memory.get(i, models[0]), fb.memory.get(i, models[0]), rtol=0, atol=1e-12)
    assert not torch.equal(fa.memory.get(3, models[0]), torch.zeros(8, dtype=torch.float64))  # something held back


def test_a_round_hands_the_channel_the_engines_clients_in_memory(tmp_path, monkeypatch):
    seen = []
    transmit = Channel.transmit

    def spy(self, client_params, up, block_rows=None):
        seen.append((client_params.shape[0], block_rows))
        return transmit(self, client_params, up, block_rows)

    monkeypatch.setattr(Channel, "transmit", spy)
    summary = run_experiment(["aggregator=fedcams", "engine=sequential", "device=cpu", "rounds=2", "num_clients=6",
                              "clients_per_round=4", "partition=iid"], tmp_path)
    assert summary["status"] == "completed" and seen == [(4, 1), (4, 1)]  # one client's model at a time


@pytest.mark.parametrize("compressor", ["sign", "topk"])
def test_peak_memory_of_fedcams_compression_follows_the_chunk(compressor):
    """New tensors a round's compression holds at once, in clients' worth of parameters (P floats), counted by
    tests/memory.py: the K = 12 errors e_k the store keeps, plus about 4 rows in blocks of one (measured 16 P for
    sign, 17 P for top-k), against about 4 K more on the whole round (60 P, 72 P)."""
    from memory import peak_bytes

    k, p = 12, 64 * 300 + 37
    peaks = []
    for rows in (1, None):
        channel = Channel().connect(Attack(), FedCAMS(compressor=compressor).channel_stages())
        g = torch.Generator().manual_seed(0)
        start = torch.randn(p, generator=g)
        models = start + torch.randn(k, p, generator=g)
        peaks.append(peak_bytes(channel.transmit, models, upload(k, p, start=start), rows)[0] / (p * 4))
    blocked, whole = peaks
    assert blocked <= k + 6 and whole >= k + 3 * k, peaks
