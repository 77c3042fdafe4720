"""The frozen base: a model's parameters turned into plain tensors, held once.

Freezing takes a tensor out of its module's parameters and keeps it as a plain attribute of the same
module, so the module's forward reads it as before, but `model.parameters()` (and with it the flat
vector every engine, rule and channel stage sees) holds only what trains, and `model.buffers()` only
what was a buffer (the base is neither averaged nor sent). Both engines run this one model object (the
parallel engine's packed copy shares its plain tensors: `fedagg.engines._packed.pack`), so the base is
in memory once however many clients train. A rule that changes the base (FLoRA's merge) adds to these
tensors in place, which every view of the model sees.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class FrozenBase:
    """The frozen tensors of a model, in a fixed order, as one flat vector [Q] to read, add to and restore."""

    def __init__(self, owners: list[tuple[nn.Module, str, str]], aliases: dict[str, str] | None = None) -> None:
        self.owners = owners  # (module, attribute, full name)
        self.names = tuple(full for _, _, full in owners)
        self.aliases = aliases or {}  # another name of a tied tensor -> the name it is held under
        self.offsets = [0]
        for module, attr, _ in owners:
            self.offsets.append(self.offsets[-1] + getattr(module, attr).numel())

    @property
    def numel(self) -> int:
        return self.offsets[-1]

    def tensors(self) -> list[Tensor]:
        return [getattr(module, attr) for module, attr, _ in self.owners]

    def vector(self) -> Tensor:
        """[Q] a copy of the base as it is now (empty when nothing is frozen)."""
        tensors = self.tensors()
        return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.zeros(0)

    def slice_of(self, name: str) -> slice:
        i = self.names.index(self.aliases.get(name, name))
        return slice(self.offsets[i], self.offsets[i + 1])

    def add_(self, delta: Tensor) -> None:
        """Add `delta` [Q] to the base, in place (every view of the model sees it)."""
        with torch.no_grad():
            for t, lo, hi in zip(self.tensors(), self.offsets, self.offsets[1:]):
                t.add_(delta[lo:hi].view_as(t).to(t.dtype))

    def load_(self, flat: Tensor) -> None:
        """Set the base to `flat` [Q] (a checkpoint's), in place."""
        with torch.no_grad():
            for t, lo, hi in zip(self.tensors(), self.offsets, self.offsets[1:]):
                t.copy_(flat[lo:hi].view_as(t))


def freeze(model: nn.Module, keep: set[int]) -> FrozenBase:
    """Turn every parameter of `model` whose id is not in `keep` into a plain tensor of its module (see the module
    docstring), in the order of `model.named_parameters()`; returns them as the model's base."""
    owners, frozen, first, aliases = [], {}, {}, {}  # frozen: id -> its plain tensor (a tied one frozen once, shared)
    for full, param in list(model.named_parameters(remove_duplicate=False)):
        if id(param) in keep:
            continue
        path, _, attr = full.rpartition(".")
        module = model.get_submodule(path)
        del module._parameters[attr]
        if id(param) not in frozen:  # the base vector holds a tied weight once, under its first name
            frozen[id(param)], first[id(param)] = param.detach().requires_grad_(False), full
            owners.append((module, attr, full))
        else:
            aliases[full] = first[id(param)]
        object.__setattr__(module, attr, frozen[id(param)])
    return FrozenBase(owners, aliases)


def plain_tensors(model: nn.Module) -> list[Tensor]:
    """The tensors kept as plain attributes of the model's modules (its frozen base; none for a plain model)."""
    return [value for module in model.modules() for value in vars(module).values() if isinstance(value, Tensor)]
