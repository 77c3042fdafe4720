"""Bits of adapter runs as the clients and the rule really send them: each client its own rank's factors, not the
flat vector padded to the largest rank; a compressor on the values a client holds.

The digits MLP (64 -> 64 -> 10) with adapters on its two Linear layers holds, per unit of rank, A rows and B
columns of (64 + 64) + (64 + 10) = 202 values; five clients of ranks 2, 4, 4, 3, 2 (15 ranks in all; padded
rank 4: P = 808) all take part; the MLP has no buffers.
"""

from __future__ import annotations

import csv
import math
import dataclasses

import pytest
import torch

from conftest import compose_config
from fedagg.channel.compress import Sign, TopK
from fedagg.run import train
from tests.uploads import upload

RANKS = "adapter.ranks=[2,4,4,3,2]"
PER_RANK = 202


def _first_row(path):
    with open(path) as f:
        return next(csv.DictReader(f))


def _run(tmp_path, *overrides):
    train(compose_config("rounds=1", "device=cpu", "num_clients=5", "adapter=lora", RANKS, "checkpoint_every=0",
                         *overrides), tmp_path)
    return _first_row(tmp_path / "metrics.csv")


@pytest.mark.parametrize("rule, down, up", [
    # FedIT: each client receives and sends its own rank's factors: 32 bits x 202 x (2 + 4 + 4 + 3 + 2)
    ("fedit", 32 * PER_RANK * 15, 32 * PER_RANK * 15),
    # FLoRA: every one of the 5 receives the stacked factors of all 15 ranks; each sends its own
    ("flora", 5 * 32 * PER_RANK * 15, 32 * PER_RANK * 15),
    # FlexLoRA: each receives the SVD truncated at its rank, and sends its factors
    ("flexlora", 32 * PER_RANK * 15, 32 * PER_RANK * 15),
    # FedSA-LoRA: A alone both ways, 64 + 64 values per rank
    ("fedsa_lora", 32 * 128 * 15, 32 * 128 * 15),
    # FFA-LoRA: B alone (A frozen), 64 + 10 values per rank
    ("ffa_lora", 32 * 74 * 15, 32 * 74 * 15),
])
def test_each_client_is_counted_at_its_own_rank(tmp_path, rule, down, up):
    row = _run(tmp_path, f"aggregator={rule}")
    assert (int(row["bits_down"]), int(row["bits_up"])) == (down, up)
    assert (int(row["bits_down_total"]), int(row["bits_up_total"])) == (down, up)
    assert (float(row["agg_bits_down"]), float(row["agg_bits_up"])) == (down, up)  # the rule's own count agrees


def test_a_compressor_is_counted_on_the_values_each_client_holds(tmp_path):
    """top-k (ratio 0.01): a client of rank r holds n = 202 r values and sends ⌈0.01 n⌉ of them with a
    ⌈log2 n⌉-bit index each: rank 2 (n = 404): 5 x (32 + 9); rank 3 (606): 7 x (32 + 10); rank 4 (808): 9 x 42."""
    row = _run(tmp_path, "aggregator=fedit", "channel=topk")
    assert int(row["bits_up"]) == 2 * 5 * 41 + 7 * 42 + 2 * 9 * 42
    assert int(row["bits_down"]) == 32 * PER_RANK * 15  # down stays dense


def test_a_compressor_sees_only_the_entries_a_client_holds():
    """Row 0 holds its first 3 of 6 entries (a lower rank, the rest zero), row 1 all 6: sign's scale is ‖u‖₁ over
    the entries held, and top-k keeps ⌈ρ n⌉ of them (ties to the lower index)."""
    rows = torch.tensor([[1.0, -2.0, 3.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0, -7.0]])
    held = torch.tensor([[True, True, True, False, False, False], [True] * 6])
    up = dataclasses.replace(upload(2, 6), held=held)
    g = torch.Generator().manual_seed(0)
    torch.testing.assert_close(Sign(error_feedback=False).client(rows, up, g),
                               torch.tensor([[2.0, -2.0, 2.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0, 2.0, -2.0]]))
    torch.testing.assert_close(TopK(ratio=0.5, error_feedback=False).client(rows, up, g),
                               torch.tensor([[0.0, -2.0, 3.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0, 0.0, -7.0]]))


def test_privacy_on_adapters_of_unequal_ranks_counts_their_values_and_the_accountants_epsilon(tmp_path):
    """channel=dp clips and noises what each client holds and sends it all; ε is the accountant's for the same
    sampling and noise, whatever the model (a run of the whole MLP)."""
    row = _run(tmp_path / "lora", "aggregator=fedit", "channel=dp")
    assert int(row["bits_up"]) == 32 * PER_RANK * 15
    train(compose_config("rounds=1", "device=cpu", "num_clients=5", "channel=dp", "checkpoint_every=0"),
          tmp_path / "whole")
    whole = _first_row(tmp_path / "whole" / "metrics.csv")
    assert row["dp_epsilon"] == whole["dp_epsilon"] and math.isfinite(float(row["dp_epsilon"]))
