"""HetLoRA's local regulariser for rank self-pruning (Cho et al., EMNLP 2024, the local training step):
λ ‖B_{k,γr:r}‖_F ‖A_{k,γr:r}‖_F on the ranks from ⌊γr⌋ to r of a client of current rank r, checked by hand.

Transcribed from the paper's equation: no code released by its authors was found (searched public repositories
for HetLoRA's self-pruning). Here the term is summed over the adapted layers, and a client keeps at least one rank.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedagg.aggregators.hetlora import HetLoRA, HetLoRAClient, SelfPruning
from fedagg.models.adapters import LoRA
from fedagg.models.flat import get_params, set_params


def _half(ranks=(4, 2, 1), strength=0.1, decay=0.5):
    """One Linear(3 -> 2) adapted at padded rank 4 (A [4, 3], B [2, 4]) for clients of `ranks`; A = 0..11 and
    B = 0..7 row by row."""
    model = nn.Sequential(nn.Linear(3, 2))
    LoRA(rank=4, ranks=list(ranks)).apply(model, len(ranks), 0)
    set_params(model, torch.cat([torch.arange(12.0), torch.arange(8.0)]))  # A first, then B (their order)
    rule = HetLoRA(decay=decay, client=SelfPruning(strength=strength))
    rule.client.setup(model)
    return model, rule.client


def _penalty(model, half, client):
    params = list(model.parameters())
    flat = get_params(model)
    state = [s.view_as(p) for s, p in zip(half.client_state(client, flat).split([p.numel() for p in params]),
                                          params)]
    return half.penalty(params, [p.detach() for p in params], state)


def _value(model, half, client) -> float:
    return float(_penalty(model, half, client).detach())


def test_the_regulariser_is_lambda_times_the_tails_norms():
    model, half = _half()
    # rank 4, γ = 0.5: ranks 2..3, A's rows [6 7 8], [9 10 11] (squares 451) and B's columns [2 6], [3 7] (98)
    assert _value(model, half, 0) == pytest.approx(0.1 * math.sqrt(451 * 98))
    # rank 2: rank 1 alone, A's row [3 4 5] (50) and B's column [1 5] (26)
    assert _value(model, half, 1) == pytest.approx(0.1 * math.sqrt(50 * 26))
    assert _value(model, half, 2) == 0.0  # rank 1 keeps its one rank: no tail
    half.ranks[0] = 2  # pruned to rank 2: its tail is now rank 1's
    assert _value(model, half, 0) == pytest.approx(0.1 * math.sqrt(50 * 26))


def test_its_gradient_reaches_the_tail_alone():
    model, half = _half()
    _penalty(model, half, 0).backward()
    a, b = list(model.parameters())
    assert torch.equal(a.grad[:2], torch.zeros(2, 3)) and torch.equal(b.grad[:, :2], torch.zeros(2, 2))
    # d/dA_tail λ ‖B_t‖ ‖A_t‖ = λ ‖B_t‖ A_t / ‖A_t‖
    expected = 0.1 * math.sqrt(98) * torch.arange(6.0, 12.0).view(2, 3) / math.sqrt(451)
    torch.testing.assert_close(a.grad[2:], expected)


def test_the_rules_decay_is_the_tail_the_regulariser_pushes_down():
    assert HetLoRA(decay=0.5).client.decay == 0.5
    assert isinstance(HetLoRA().client, SelfPruning)  # the paper's form is the default
    assert HetLoRAClient.adds_to_loss is False and SelfPruning.adds_to_loss is True
