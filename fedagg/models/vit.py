"""`model=vit_tiny`: a small vision transformer (Dosovitskiy et al. 2021) for fedagg's image datasets.

Images of C x S x S (the data pipeline resizes to `input_size` when it is set, as for the
ResNets) are cut into (S / patch)^2 patches, each flattened and embedded by one nn.Linear (what
a stride-`patch` convolution computes, as a linear layer an adapter can wrap); a class token and
learned position embeddings go in front, then `depth` pre-norm blocks (models/transformer.py),
a final LayerNorm, and the classifier on the class token. With `pretrained`, the weights come
from a base file (models/pretrained.py).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fedagg.models.base import Backbone
from fedagg.models.pretrained import load_base
from fedagg.models.transformer import Block, check_shape


class ViT(Backbone):
    """patches -> Linear -> [cls; tokens] + positions -> blocks -> LayerNorm -> cls token -> Linear(C). Its
    representation is the normalised class token, [B, dim]."""

    classifier_name = "head"

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int, input_size: int | None = None,
                 patch_size: int = 4, dim: int = 64, depth: int = 4, heads: int = 4, mlp_ratio: int = 2,
                 pretrained: str | None = None):
        super().__init__()
        side = image_size if input_size is None else input_size
        check_shape("vit", dim, heads, depth)
        if isinstance(patch_size, bool) or not isinstance(patch_size, int) or patch_size < 1 or side % patch_size:
            raise ValueError(f"model.patch_size={patch_size!r} is not allowed on {side}x{side} images: it must be "
                             f"an integer that divides {side} (or set model.input_size to a multiple of it)")
        self.arch = dict(input_size=side, patch_size=patch_size, dim=dim, depth=depth, heads=heads,
                         mlp_ratio=mlp_ratio, in_channels=in_channels)
        self.input_shape = (in_channels, side, side)
        self.patch = patch_size
        self.embed = nn.Linear(in_channels * patch_size * patch_size, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, (side // patch_size) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio, causal=False) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        if pretrained:
            load_base(self, pretrained)

    def patches(self, x: Tensor) -> Tensor:
        """[B, C, S, S] -> [B, (S/p)^2, C*p*p], row-major over the patch grid, each patch as (c, i, j)."""
        b, c, s, _ = x.shape
        p, n = self.patch, s // self.patch
        return x.reshape(b, c, n, p, n, p).permute(0, 2, 4, 1, 3, 5).reshape(b, n * n, c * p * p)

    def encode(self, x: Tensor) -> Tensor:
        h = self.embed(self.patches(x))
        h = torch.cat([self.cls_token.expand(h.shape[0], -1, -1), h], dim=1) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.norm(h[:, 0])

    def classify(self, h: Tensor) -> Tensor:
        return self.head(h)
