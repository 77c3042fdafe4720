"""`engine=auto` (the default): the parallel engine on a GPU, the sequential one on the CPU.

On a GPU the sequential engine is bound by kernel launches (one client's small batches at a
time); the parallel engine serves a chunk of clients per launch. On the CPU the sequential
engine is the faster one for the convolutional backbones with few clients (grouped
convolutions cost more there than they save), and it is the reference. The choice follows
the resolved device, which a run records and a resume must match, so a resumed run runs
the engine it started with.
"""

from __future__ import annotations

from fedagg.engines.base import Engine
from fedagg.engines.parallel import ParallelEngine
from fedagg.engines.sequential import SequentialEngine
from fedagg.data.device import resolve_device


def auto_engine(device: str = "auto", eval_batch_size: int = 1024, chunk_size: int | str = "auto",
                precision: str = "fp32", channels_last: bool = False, compile: bool = False) -> Engine:
    """ParallelEngine with these options where `device` resolves to CUDA; else SequentialEngine, which must
    then be asked for nothing only the parallel engine does."""
    if resolve_device(device).type == "cuda":
        return ParallelEngine(eval_batch_size, chunk_size, precision, channels_last, compile)
    parallel_only = {"precision": (precision, "fp32"), "channels_last": (channels_last, False), "compile": (compile, False)}
    for key, (value, default) in parallel_only.items():
        if value != default:
            raise ValueError(f"engine.{key}={value!r} needs the parallel engine, which engine=auto runs only on a GPU; "
                             f"use engine=parallel to run it on the CPU")
    return SequentialEngine(eval_batch_size)
