"""`engine=auto` (the default): the engine that is faster for the run's workload on its device.

Which one is a rule on the configuration alone (`fedagg.engines.choice`: clients a round, the model's kind and size,
the batch size, the device), never on timings, so a run and its resume choose alike; the run records the choice and
its reason (summary.json's `engine_auto_picked` and `engine_auto_reason`), and a resume keeps the recorded engine
(the sequential one on the CPU and the parallel one on a GPU for a run written before the rule, which had that
choice), whatever the rule says now. The options only the parallel engine has (precision, channels_last, compile)
are refused in one line where the rule picks the sequential engine.

A stacked sweep (hydra/launcher=stacked) trains its engine=auto jobs with the parallel engine whatever the
device: the user asked for their rounds to be trained together. Such a job records the parallel engine's node
(`as_parallel`), and a resume takes the engine its folder recorded when the two differ only that way
(`recorded_engine`), so that the same job resumed by the basic launcher is neither refused nor switched to
another engine mid-run.
"""

from __future__ import annotations

from fedagg.clients.trainer import LocalSGD
from fedagg.data.device import resolve_device
from fedagg.engines.base import Engine, RoundJob, RoundResult
from fedagg.engines.choice import Picked, RoundShape, choose
from fedagg.engines.parallel import ParallelEngine
from fedagg.engines.sequential import SequentialEngine

AUTO, PARALLEL = "fedagg.engines.auto.auto_engine", "fedagg.engines.parallel.ParallelEngine"
CHOICE = {AUTO: "auto", PARALLEL: "parallel"}  # the engine group's option of each (summary.json's choices)
PICKED, REASON = "engine_auto_picked", "engine_auto_reason"  # summary.json's record of the choice


def auto_engine(device: str = "auto", eval_batch_size: int = 1024, chunk_size: int | str = "auto",
                precision: str = "fp32", channels_last: bool = False, compile: bool = False) -> "AutoEngine":
    """engine=auto: the choice is made once the run's model is known (`AutoEngine.for_run`)."""
    return AutoEngine(resolve_device(device).type, ParallelEngine(eval_batch_size, chunk_size, precision,
                                                                  channels_last, compile))


class AutoEngine(Engine):
    """The parallel or the sequential engine, chosen for the run by `fedagg.engines.choice.choose`."""

    def __init__(self, device: str, parallel: ParallelEngine) -> None:
        super().__init__(parallel.eval_batch_size)
        self.device, self.parallel = device, parallel
        self.kept: Picked | None = None  # a resumed run's pick, from its checkpoint
        self.unstackable: str | None = None  # why the parallel engine cannot run this local training

    def keep(self, picked: Picked) -> "AutoEngine":
        """Train with the engine a resumed run's earlier rounds trained with, whatever the rule says now."""
        self.kept = picked
        return self

    def check(self, trainer: LocalSGD) -> None:
        try:
            self.parallel.check(trainer)
        except ValueError as err:
            if self.device == "cuda" or (self.kept and self.kept.engine == "parallel"):  # as it did
                raise
            self.unstackable = str(err).split(";")[0]

    def for_run(self, shape: RoundShape) -> tuple[Engine, Picked]:
        if self.kept is not None:
            name, reason = self.kept.engine, self.kept.reason
        elif self.unstackable is not None:
            name, reason = "sequential", self.unstackable
        else:
            name, reason = choose(shape)
        if name == "parallel":
            return self.parallel, Picked(name, reason)
        p = self.parallel
        for key, value, default in (("precision", p.precision, "fp32"), ("channels_last", p.channels_last, False),
                                    ("compile", p.compile, False)):
            if value != default:
                raise ValueError(f"engine.{key}={value!r} needs the parallel engine, which engine=auto does not pick "
                                 f"for this run ({reason}); use engine=parallel, or leave engine.{key} at {default!r}")
        return SequentialEngine(self.eval_batch_size), Picked(name, reason)

    def train_round(self, job: RoundJob) -> RoundResult:
        raise RuntimeError("engine=auto trains through the engine it picks: fedagg.loop.assembly.assemble asks it")


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
