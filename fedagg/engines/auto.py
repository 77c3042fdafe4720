"""`engine=auto` (the default): the parallel engine on a GPU, the sequential one on the CPU.

On a GPU the sequential engine is bound by kernel launches (one client's small batches at a
time); the parallel engine serves a chunk of clients per launch. On the CPU the sequential
engine is the faster one for the convolutional backbones with few clients (grouped
convolutions cost more there than they save), and it is the reference. The choice follows
the resolved device, which a run records and a resume must match, so a resumed run runs
the engine it started with.

A stacked sweep (hydra/launcher=stacked) trains its engine=auto jobs with the parallel engine whatever the
device: the user asked for their rounds to be trained together. Such a job records the parallel engine's node
(`as_parallel`), and a resume takes the engine its folder recorded when the two differ only that way
(`recorded_engine`), so that the same job resumed by the basic launcher is neither refused nor switched to
another engine mid-run.
"""

from __future__ import annotations

from fedagg.engines.base import Engine
from fedagg.engines.parallel import ParallelEngine
from fedagg.engines.sequential import SequentialEngine
from fedagg.data.device import resolve_device

AUTO, PARALLEL = "fedagg.engines.auto.auto_engine", "fedagg.engines.parallel.ParallelEngine"
CHOICE = {AUTO: "auto", PARALLEL: "parallel"}  # the engine group's option of each (summary.json's choices)


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


def as_parallel(node: dict) -> dict:
    """The parallel engine's config node with the options of an engine=auto node (the device is the run's own)."""
    return {"_target_": PARALLEL, **{k: v for k, v in node.items() if k not in ("_target_", "device")}}


def stacked_alike(a: object, b: object) -> bool:
    """Whether two engine nodes differ only as an engine=auto job alone and trained in a stacked sweep."""
    if not (isinstance(a, dict) and isinstance(b, dict)) or a == b:
        return False
    auto, other = (a, b) if a.get("_target_") == AUTO else (b, a)
    return auto.get("_target_") == AUTO and as_parallel(auto) == other


def recorded_engine(recorded: dict, requested: dict) -> dict | None:
    """The engine node a resumed run must keep when it differs from the one now asked for only as engine=auto
    alone and stacked (the engine that trained its earlier rounds); None when there is nothing to keep."""
    return recorded if stacked_alike(recorded, requested) else None
