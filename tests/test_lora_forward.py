"""The adapted layers compute W₀ x + s B (A x): the same function as the merged weight W₀ + s B A, which training
never forms (under the parallel engine that weight, and its gradient, would be a copy of the base per client in
memory: scripts/adapter_memory.py measures it)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedagg.models.adapters import LoRA
from fedagg.models.adapters.lora import LowRank


def _adapted(layer: nn.Module, rank: int = 3, alpha: float = 6.0):
    torch.manual_seed(0)
    model = nn.Sequential(layer)
    w0 = layer.weight.detach().clone()
    bias = None if layer.bias is None else layer.bias.detach().clone()
    LoRA(rank=rank, alpha=alpha).apply(model, 2, 0)
    low = layer.parametrizations.weight[0]
    with torch.no_grad():
        low.B.copy_(torch.randn(low.B.shape))  # B starts at zero: make the adapter do something
    return model, w0, bias, low, alpha / rank


@pytest.mark.parametrize("layer, x", [
    (nn.Linear(5, 4), torch.randn(2, 3, 5)),
    (nn.Conv2d(4, 6, 3, stride=2, padding=1), torch.randn(2, 4, 7, 7)),
    (nn.Conv2d(4, 6, 3, padding=1, groups=2, bias=False), torch.randn(2, 4, 5, 5)),  # two groups of channels
])
def test_the_layer_is_the_merged_weights_function(layer, x):
    model, w0, bias, low, s = _adapted(layer)
    merged = w0 + s * (low.B @ low.A).view_as(w0)
    if isinstance(layer, nn.Linear):
        want = F.linear(x, merged, bias)
    else:
        want = F.conv2d(x, merged, bias, layer.stride, layer.padding, groups=layer.groups)
    torch.testing.assert_close(model(x), want)
    torch.testing.assert_close(layer.weight, merged)  # what the module's weight (and model.pt) reads


def test_training_never_forms_the_merged_weight(monkeypatch):
    model, *_ = _adapted(nn.Linear(5, 4))
    formed = []
    monkeypatch.setattr(LowRank, "forward", lambda self, w: formed.append(w) or w)
    model(torch.randn(2, 5)).sum().backward()
    assert formed == []
    assert model[0].parametrizations.weight[0].B.grad is not None
