"""What every backbone exposes beyond its logits: its representation, through one typed method.

A `Backbone` is split at its last linear layer: `encode(x)` computes the representation h(x)
(the input of that layer) and `classify(h)` the logits from it; `forward(x)` is the two in
turn, so a backbone computes exactly what it computed before it was split. `represent(x)`
returns both at once, as a `Representation`, for a client objective that reads the
representation (MOON, FedDecorr) as well as the logits.

`add_projection_head(dim)` puts MOON's projection head under the classifier (Li, He, Song 2021,
`model.py` ModelFedCon): h -> Linear(d, d) -> ReLU -> Linear(d, dim) = z, and a new last layer
Linear(dim, C) in place of the old one; the representation is then z, the input of the new
last layer.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn


def at_least_float32(t: Tensor) -> Tensor:
    """t as float32 when it is of lower precision (bf16/fp16 under autocast), else as it is: losses and terms are
    taken in float32 at least, and a float64 model's stay float64 (`.float()` would round them to float32)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class Representation(NamedTuple):
    """A batch through a backbone: h(x) [B, d] (per position for a sequence model: [B, T, d]) and the logits
    computed from it [B, C] ([B, T, C]). A tuple, so that torch.func.vmap returns it per client."""

    features: Tensor
    logits: Tensor


class Backbone(nn.Module):
    """A classifier whose last layer is linear; a subclass names that layer (`classifier_name`, a submodule
    path) and implements `encode` (everything before it) and `classify` (it)."""

    classifier_name: str = ""
    takes: str | None = None  # the one kind of dataset inputs it is built for (fedagg.data.datasets.INPUT_KINDS), if one

    def __init__(self) -> None:
        super().__init__()
        self.projection: nn.Module | None = None  # MOON's head between encode and classify, when added

    def encode(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def classify(self, h: Tensor) -> Tensor:
        raise NotImplementedError

    def represent(self, x: Tensor) -> Representation:
        """The representation (after the projection head, when there is one) and the logits made from it."""
        h = self.encode(x)
        if self.projection is not None:
            h = self.projection(h)
        return Representation(h, self.classify(h))

    def forward(self, x: Tensor) -> Tensor:
        h = self.encode(x)
        if self.projection is not None:
            h = self.projection(h)
        return self.classify(h)

    @property
    def last_layer(self) -> nn.Linear:
        return self.get_submodule(self.classifier_name)

    @property
    def representation_dim(self) -> int:
        """Features per sample (or position) of `represent(x).features`."""
        return self.last_layer.in_features

    def add_projection_head(self, dim: int) -> None:
        """h -> Linear(d, d) -> ReLU -> Linear(d, dim) under a new last layer Linear(dim, C) (ModelFedCon); the
        new layers draw from torch's generator, which the run seeds with the model's own stream."""
        d, last = self.representation_dim, self.last_layer
        self.projection = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, dim))
        self.set_submodule(self.classifier_name, nn.Linear(dim, last.out_features, device=last.weight.device))
        self.projection.to(last.weight.device)


def run_through(layers: nn.Sequential, x: Tensor, stop: int | None = None) -> Tensor:
    """`x` through `layers[:stop]`, one after another (as nn.Sequential runs them, without building a slice)."""
    for i, layer in enumerate(layers):
        if stop is not None and i >= stop % len(layers):
            break
        x = layer(x)
    return x
