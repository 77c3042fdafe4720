"""Peak memory of the tensors an operation allocates, counted on the CPU.

A dispatch mode sees every tensor an operator returns; a storage that none of the
operator's inputs shares is a new allocation, counted until it is freed. The peak is the
most bytes such allocations held at once: what the operation adds on top of its inputs.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class PeakAllocations(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = id(storage)
            if key in self.live or storage.nbytes() == 0 or storage.data_ptr() in inputs:
                continue  # already counted, empty, or a view of an input
            self.live[key] = storage.nbytes()
            self.peak = max(self.peak, sum(self.live.values()))
            weakref.finalize(storage, self.live.pop, key, None)
        return out


def peak_bytes(fn, *args, **kwargs) -> tuple[int, object]:
    """(the most bytes `fn(*args, **kwargs)` held in new tensors at once, its result)."""
    with PeakAllocations() as mode:
        result = fn(*args, **kwargs)
    return mode.peak, result
