"""The pre-norm transformer block shared by fedagg's own transformers (`vit_tiny`, `char_decoder`).

Every projection is a plain nn.Linear (query, key, value, output; the MLP's two layers) so that
an adapter that wraps linear layers (LoRA) finds them by name, and the parallel engine's vmap
turns each into one batched matmul over the stacked clients. Attention is written out rather
than taken from nn.MultiheadAttention (whose input projection is one fused parameter, not a
linear layer) or F.scaled_dot_product_attention (whose fused kernels differ between a batch and
its stacked clients): with these plain matmuls the two engines compute the same arithmetic.
No dropout: a client's forward pass is then a function of its weights and batch alone.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class Attention(nn.Module):
    """Multi-head self-attention over [B, T, D]; `causal`: position t attends to positions <= t only."""

    def __init__(self, dim: int, heads: int, causal: bool):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731 - [B, H, T, d/H]
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        if self.causal:
            future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        out = scores.softmax(-1) @ v
        return self.o(out.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """x + attn(LN(x)), then + mlp(LN(x)) with a GELU MLP of `mlp_ratio` * dim (GPT-2's and ViT's layout)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int, causal: bool):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, causal)
        self.fc1, self.fc2 = nn.Linear(dim, mlp_ratio * dim), nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


def check_shape(model: str, dim: int, heads: int, depth: int) -> None:
    """One line for a width the heads cannot share, before any weight is drawn."""
    for key, value in (("dim", dim), ("heads", heads), ("depth", depth)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"model.{key}={value!r} is not allowed for {model}; use an integer >= 1")
    if dim % heads:
        raise ValueError(f"model.dim={dim} is not allowed with model.heads={heads} for {model}: "
                         f"the heads split the width, so dim must be a multiple of heads")
