"""Separate, named random streams derived from the run's seed.

Partitioning, client sampling, batch order, augmentation and the initial weights each
draw from their own stream, so two runs that differ only in the aggregator see the same
clients, batches and starting model (DESIGN principle 5). Streams are keyed by extra
values (round, client id) rather than advanced statefully: a client's batches in round r
do not depend on which other clients trained before it, nor on the engine, and a resumed
run can rebuild any stream from the round number alone.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Iterator

import torch


def stream_seed(seed: int, stream: str, *keys: int) -> int:
    """A 63-bit seed that depends only on (seed, stream, keys)."""
    text = repr((int(seed), stream, *(int(k) for k in keys))).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


def generator(seed: int, stream: str, *keys: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A fresh torch.Generator for one named stream."""
    g = torch.Generator(device=device)
    g.manual_seed(stream_seed(seed, stream, *keys))
    return g


@contextlib.contextmanager
def global_rng(seed: int, device: str | torch.device = "cpu") -> Iterator[None]:
    """Within: torch's global CPU generator, and `device`'s when it is a GPU, seeded with `seed`; after: as before.
    For draws made by code that takes no generator (a model's initializers, nn.Dropout), so that they too depend
    only on the run's seed and keys, not on what the process drew before (another run of a stacked sweep, or the
    rounds before a resume)."""
    device = torch.device(device)
    gpu = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=gpu):
        torch.default_generator.manual_seed(seed)  # torch.manual_seed would reseed every GPU
        if gpu:
            torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]\
                .manual_seed(seed)
        yield
