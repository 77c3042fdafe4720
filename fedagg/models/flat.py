"""Flat views of a model: trainable parameters and buffers as 1-D tensors.

Aggregators work on `Tensor[P]` / `Tensor[K, P]` (DESIGN principle 3); this module is
the only place that converts between those vectors and an `nn.Module`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector

if TYPE_CHECKING:
    from fedagg.models.adapters.layout import AdapterLayout


@dataclass(frozen=True)
class ParamLayout:
    """Where each parameter tensor (a "layer" for layer-wise rules) sits in the flat vector."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    offsets: tuple[int, ...]  # len(names) + 1 boundaries; offsets[-1] == P
    # with adapter=lora: which entries are each layer's A and B, the padded rank, each client's rank; None: no adapters
    adapters: AdapterLayout | None = None

    @classmethod
    def of(cls, module: nn.Module) -> "ParamLayout":
        names, shapes, offsets = [], [], [0]
        for name, p in module.named_parameters():
            names.append(name)
            shapes.append(p.shape)
            offsets.append(offsets[-1] + p.numel())
        return cls(tuple(names), tuple(shapes), tuple(offsets))

    @property
    def num_params(self) -> int:
        return self.offsets[-1]

    @property
    def slices(self) -> list[slice]:
        return [slice(a, b) for a, b in zip(self.offsets[:-1], self.offsets[1:])]

    def __len__(self) -> int:
        return len(self.names)


def unflatten(flat: Tensor, shapes: list[torch.Size] | tuple[torch.Size, ...]) -> list[Tensor]:
    """Views of `flat` [..., P] as one [..., *shape] tensor per parameter (the inverse of flattening)."""
    lead = flat.shape[:-1]
    parts = flat.split([s.numel() for s in shapes], dim=-1)
    return [part.view((*lead, *shape)) for part, shape in zip(parts, shapes)]


def get_params(module: nn.Module) -> Tensor:
    return parameters_to_vector(module.parameters()).detach().clone()


def set_params(module: nn.Module, flat: Tensor) -> None:
    """Copy `flat` into the parameters. (torch's vector_to_parameters would make them views of
    `flat`, so local training would write into the caller's global vector.)"""
    offset = 0
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def get_buffers(module: nn.Module) -> Tensor:
    """All buffers (BatchNorm statistics) as one float vector; empty when there are none.

    Integer buffers (num_batches_tracked) travel as floats: exact below 2**24, and they
    are rounded back when written.
    """
    bufs = [b.detach().reshape(-1).float() for b in module.buffers()]
    if not bufs:
        return torch.zeros(0, device=next(module.parameters()).device)
    return torch.cat(bufs)


def set_buffers(module: nn.Module, flat: Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for b in module.buffers():
            chunk = flat[offset : offset + b.numel()].view_as(b)
            b.copy_(chunk.round() if not b.dtype.is_floating_point else chunk)
            offset += b.numel()
