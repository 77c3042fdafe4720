"""Which engine `engine=auto` runs: a rule on the configuration alone (never on timings), so that a run and its
resume choose alike. The rule is data (`CPU_PARALLEL`) and one function (`choose`); `model_kind` names what kind of
model a run trains."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

KINDS = ("conv", "linear", "recurrent", "transformer")


@dataclass(frozen=True)
class RoundShape:
    """What the choice reads of a run: its clients a round, its model's kind and size, its batch size, its device."""

    per_round: int
    kind: str  # one of KINDS
    params: int
    batch_size: int
    device: str  # cpu | cuda

    def words(self) -> str:
        where = "on the CPU" if self.device == "cpu" else "on a GPU"
        return (f"{self.per_round} client{'s' if self.per_round != 1 else ''} a round of a {_size(self.params)}-param "
                f"{self.kind} model, batch {self.batch_size}, {where}")


@dataclass(frozen=True)
class Picked:
    """What engine=auto picked for a run, and why: the start-up line and summary.json say it."""

    engine: str  # parallel | sequential
    reason: str

    def line(self) -> str:
        return f"engine: {self.engine} (auto: {self.reason})"


def model_kind(model: nn.Module) -> str:
    """recurrent, transformer, conv or linear: the first of these whose layers the model holds (a ViT's patch
    embedding is a convolution, its blocks attention)."""
    names = [type(m).__name__ for m in model.modules()]
    if any(isinstance(m, (nn.RNNBase, nn.RNNCellBase)) for m in model.modules()) or any(
            n.startswith(("LSTM", "GRU", "RNN")) and n != type(model).__name__ for n in names):
        return "recurrent"
    if any(isinstance(m, nn.MultiheadAttention) for m in model.modules()) or any(n.endswith("Attention") for n in names):
        return "transformer"
    if any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules()):
        return "conv"
    return "linear"


def _size(params: int) -> str:
    return f"{params / 1e6:.2g}M" if params >= 1e5 else f"{params / 1e3:.2g}k"


# On the CPU the parallel engine where every bound holds (scripts/engine_grid.py measured them; docs/explanations/
# speed.md has the table): rounds of at least `min_clients` clients, batches of at most `max_batch` samples, a model
# of these kinds of at most `max_params` parameters.
CPU_PARALLEL = {"min_clients": 10, "max_batch": 32, "max_params": 1_000_000, "kinds": ("conv", "linear")}


def choose(shape: RoundShape) -> tuple[str, str]:
    """(engine: parallel | sequential, why in words)."""
    words = shape.words()
    if shape.device == "cuda":
        return "parallel", f"{words}: a GPU serves a chunk of clients a launch"
    rule = CPU_PARALLEL
    if shape.kind not in rule["kinds"]:
        return "sequential", f"{words}: stacked {shape.kind} models are slower on the CPU"
    if shape.per_round < rule["min_clients"]:
        return "sequential", f"{words}: fewer than {rule['min_clients']} clients a round to stack"
    if shape.batch_size > rule["max_batch"]:
        return "sequential", f"{words}: batches above {rule['max_batch']} keep the CPU busy one client at a time"
    if shape.params > rule["max_params"]:
        return "sequential", f"{words}: models above {_size(rule['max_params'])} parameters are not stacked on the CPU"
    return "parallel", words
