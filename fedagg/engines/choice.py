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


# On the CPU the parallel engine where every bound of the model's kind holds; no other kind is stacked there. From
# scripts/engine_grid.py, one thread on the 2-core AMD EPYC, two sittings (docs/explanations/speed.md has the table),
# parallel / sequential time a round: linear models stack from 5 clients a round (digits MLP: 0.46-0.57 at 10,
# 0.70-0.82 at 5, 1.37-2.07 at 2; MNIST MLR, 100 clients of batch 10: 0.14-0.17); convolutional ones only when
# small and fed small batches (cnn_small, 22k parameters, batch 10: 0.47-0.59 at 100 clients, 0.58-0.64 at 10;
# batch 32: 0.97-1.01; ResNet-20, 0.27M: 1.09-1.17 at batch 10, 1.21-1.79 at 32; LeNet, batch 64: 0.98-1.68);
# the 2-layer LSTM was slower (1.22-1.63). On a GPU the parallel engine always.
CPU_PARALLEL = {
    "linear": {"min_clients": 5, "max_batch": 32, "max_params": 100_000},
    "conv": {"min_clients": 10, "max_batch": 10, "max_params": 100_000},
}


def choose(shape: RoundShape) -> tuple[str, str]:
    """(engine: parallel | sequential, why in words)."""
    words = shape.words()
    if shape.device == "cuda":
        return "parallel", f"{words}: a GPU serves a chunk of clients a launch"
    rule = CPU_PARALLEL.get(shape.kind)
    if rule is None:
        return "sequential", f"{words}: stacked {shape.kind} models are not faster on the CPU"
    if shape.per_round < rule["min_clients"]:
        return "sequential", f"{words}: fewer than {rule['min_clients']} clients a round to stack"
    if shape.batch_size > rule["max_batch"]:
        return "sequential", f"{words}: batches above {rule['max_batch']} keep the CPU busy one client at a time"
    if shape.params > rule["max_params"]:
        return "sequential", f"{words}: above {_size(rule['max_params'])} params one model keeps the CPU busy"
    return "parallel", words
