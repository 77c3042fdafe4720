"""Low-rank adapters on any backbone (`adapter=lora`): the base frozen, ΔW = (α/rank) B A trained.

Every targeted nn.Linear and nn.Conv2d weight W₀ [d, k] (a convolution's [out, in·kh·kw]) gets
torch's parametrization W₀ + s B A (what `module.weight` reads), and the module computes W₀ x + s B (A x), so
that no client's merged weight is ever made in training; the model around it runs unchanged. B [d, R]
starts at zero and A [R, k] from the adapters' own seeded stream (kaiming-uniform with a = √5, the
usual LoRA start), so the adapted model starts as the base. Everything else (biases, normalisation
layers, the base weights) is frozen (`frozen.py`): the flat vector that engines, rules and channel
stages see is the adapters alone.

Clients may have ranks of their own (`ranks`: one per client; `rank_choices`: each client draws one,
seeded, standing for its device's resources). The flat vector then holds every factor padded to the
largest rank R, and a client of rank r starts each round from the first r rows of A and columns of B
with the rest zero (`LocalSGD.rank_masks`): their gradients are then exactly zero, so what it uploads
is its rank-r factors zero-padded, which is the padding the rules assume. A fixed P is what lets
every engine stack clients and every rule and stage work unchanged; the cost is R − r zeros per layer,
not counted as sent (the rules count r (d + k) values per layer). The scale s = α / rank uses the
configured `rank` for every client, so that the padded factors of clients of different ranks mean the
same ΔW and can be averaged.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from fedagg.config.constraints import Items, Range, checked
from fedagg.models.adapters.frozen import FrozenBase, freeze
from fedagg.models.adapters.layout import AdapterLayout, Pair
from fedagg.seeding import generator

ADAPTED = (nn.Linear, nn.Conv2d)


class LowRank(nn.Module):
    """The parametrization W -> W + s (B A), reshaped to W's shape."""

    def __init__(self, a: Tensor, d: int, scale: float, client_ranks: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.A = nn.Parameter(a)
        self.B = nn.Parameter(a.new_zeros(d, a.shape[0]))
        self.scale = scale
        self.client_ranks = client_ranks  # each client's rank by id: how many of A's rows (B's columns) it uses

    def forward(self, weight: Tensor) -> Tensor:
        return weight + self.scale * (self.B @ self.A).view(weight.shape)


# The adapted layers' forward: W₀ x + s B (A x), never W₀ + s B A itself. The merged weight (`module.weight`, what
# `model_state` saves) is d x k per client: the parallel engine, which runs a chunk of clients at once, would hold
# it (and its gradient) for every client in the chunk, a copy of the base per client; B (A x) is r (d + k).

def _linear(self, x: Tensor) -> Tensor:
    low = self.parametrizations.weight[0]
    base = F.linear(x, self.parametrizations.weight.original, self.bias)
    return base + low.scale * F.linear(F.linear(x, low.A), low.B)


def _conv(self, x: Tensor) -> Tensor:
    """A's rows as r kernels of W₀'s shape (per group of channels), then B as a 1x1 convolution: by linearity, the
    convolution with s B A as its weight."""
    low, w0 = self.parametrizations.weight[0], self.parametrizations.weight.original
    rank = low.A.shape[-2]
    a = low.A.view(rank, *w0.shape[1:]).repeat(self.groups, 1, 1, 1)  # [groups r, in / groups, kh, kw]
    b = low.B.view(w0.shape[0], rank, 1, 1)
    return self._conv_forward(x, w0, self.bias) + low.scale * F.conv2d(self._conv_forward(x, a, None), b,
                                                                       groups=self.groups)


_FORWARDS = {nn.Linear: _linear, nn.Conv2d: _conv}
_CLASSES: dict[type, type] = {}


def low_rank_forward(module: nn.Module, kind: type) -> None:
    """Give a parametrized Linear or Conv2d the forward above (its class becomes a subclass of torch's parametrized
    one: copies, such as the parallel engine's packed model, keep it)."""
    cls = type(module)
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"LoRA{kind.__name__}", (cls,), {"forward": _FORWARDS[kind]})
    module.__class__ = _CLASSES[cls]


def initial_a(rank: int, k: int, gen: torch.Generator) -> Tensor:
    """A [rank, k] drawn as LoRA starts it: kaiming-uniform with a = √5, i.e. U(−1/√k, 1/√k)."""
    bound = 1.0 / math.sqrt(k)
    return torch.empty(rank, k).uniform_(-bound, bound, generator=gen)


def load_base(model: nn.Module, path: str) -> None:
    """The pretrained base: a fedagg run's model.pt (a plain state dict of the same model; an adapter run's has its
    adapters merged)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except (OSError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"adapter.base_from={path!r} is not allowed: {first}; give the model.pt of a run of the "
                         f"same model (model={type(model).__name__})") from None


@dataclass
class Adapters:
    """A model's adapters as the run holds them: where they sit (None: no adapters) and the frozen base."""

    layout: AdapterLayout | None
    base: FrozenBase
    line: str = ""  # the start-up line's part about them

    @classmethod
    def none(cls) -> "Adapters":
        return cls(None, FrozenBase([]))

    def model_state(self, model: nn.Module) -> dict[str, Tensor]:
        """The model as a plain state dict (CPU): with adapters, each adapted weight merged, W₀ + s B A, under the
        base model's own names, so that `adapter.base_from` (or the plain model) loads it."""
        if self.layout is None:
            return {k: v.detach().cpu() for k, v in model.state_dict().items()}
        state = {}
        with torch.no_grad():
            for full in (*self.base.names, *self.base.aliases):  # a tied weight under each of its names
                path, _, attr = full.rpartition(".")
                if full.endswith(".parametrizations.weight.original"):
                    path = full.removesuffix(".parametrizations.weight.original")
                    state[f"{path}.weight"] = model.get_submodule(path).weight.detach().cpu()
                elif ".parametrizations." not in full:  # a frozen A (FFA-LoRA) is part of the merged weight
                    state[full] = getattr(model.get_submodule(path), attr).detach().cpu()
            state.update({k: v.detach().cpu() for k, v in model.named_buffers()})
        return state


class NoAdapter:
    """`adapter=none`: the whole model trains."""

    frozen_a = False

    def apply(self, model: nn.Module, num_clients: int, seed: int, frozen_a: bool = False) -> Adapters:
        return Adapters.none()

    def check(self, num_clients: int | None) -> None:
        pass


class LoRA(NoAdapter):
    """`conf/adapter/lora.yaml`."""

    @checked("adapter.")
    def __init__(self, rank: Annotated[int, Range(ge=1, integer=True)] = 4,
                 alpha: Annotated[float, Range(gt=0, finite=True)] = 8.0,
                 targets: list[str] | None = None, conv: bool = True,
                 ranks: Annotated[list[int] | None, Items(Range(ge=1, integer=True))] = None,
                 rank_choices: Annotated[list[int] | None, Items(Range(ge=1, integer=True))] = None,
                 base_from: str | None = None) -> None:
        if ranks is not None and rank_choices is not None:
            raise ValueError(f"adapter.ranks={list(ranks)} and adapter.rank_choices={list(rank_choices)} are not "
                             "allowed together; give each client's rank (ranks) or the ranks they draw from")
        if rank_choices is not None and not rank_choices:
            raise ValueError("adapter.rank_choices=[] is not allowed; give the ranks clients draw from, e.g. [2,4,8]")
        self.rank, self.alpha, self.conv, self.base_from = rank, float(alpha), conv, base_from
        self.targets = None if targets is None else list(targets)
        self.ranks = None if ranks is None else [int(r) for r in ranks]
        self.rank_choices = None if rank_choices is None else [int(r) for r in rank_choices]

    def check(self, num_clients: int | None) -> None:
        """Refuse a list of ranks that is not one per client (before any data is loaded)."""
        if self.ranks is not None and num_clients is not None and len(self.ranks) != num_clients:
            raise ValueError(f"adapter.ranks={self.ranks} is not allowed with num_clients={num_clients}; give one "
                             f"rank per client ({num_clients} items), or adapter.rank_choices to draw them")

    def client_ranks(self, num_clients: int, seed: int) -> list[int]:
        if self.ranks is not None:
            return list(self.ranks)
        if self.rank_choices is None:
            return [self.rank] * num_clients
        drawn = torch.randint(len(self.rank_choices), (num_clients,), generator=generator(seed, "adapter_ranks"))
        return [self.rank_choices[i] for i in drawn.tolist()]

    def targeted(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        kinds = ADAPTED if self.conv else (nn.Linear,)
        found = [(name, m) for name, m in model.named_modules() if type(m) in kinds]
        if self.targets is not None:
            found = [(n, m) for n, m in found if any(fnmatch.fnmatchcase(n, pattern) for pattern in self.targets)]
        if not found:
            kinds_shown = "nn.Linear or nn.Conv2d" if self.conv else "nn.Linear"
            raise ValueError(f"adapter.targets={self.targets} is not allowed with model {type(model).__name__}: it "
                             f"selects none of its {kinds_shown} layers; give module names (patterns like "
                             f"'net.*'), or null for all of them")
        return found

    def apply(self, model: nn.Module, num_clients: int, seed: int, frozen_a: bool = False) -> Adapters:
        """Adapt `model` in place (its targeted weights parametrized, everything else frozen); `frozen_a`: A is
        frozen too (FFA-LoRA). A is drawn from the run's "adapter_init" stream, layer by layer."""
        self.check(num_clients)
        if self.base_from is not None:
            load_base(model, self.base_from)
        ranks = self.client_ranks(num_clients, seed)
        big, scale = max(ranks), self.alpha / self.rank
        gen = generator(seed, "adapter_init")
        shapes = []
        targeted = self.targeted(model)
        for name, module in targeted:
            weight, kind = module.weight, type(module)
            d, k = weight.shape[0], weight[0].numel()
            a = initial_a(big, k, gen).to(weight.device, weight.dtype)
            parametrize.register_parametrization(module, "weight", LowRank(a, d, scale, tuple(ranks)))
            low_rank_forward(module, kind)
            shapes.append((name, d, k, tuple(weight.shape)))
        keep = {id(m.B) for m in model.modules() if isinstance(m, LowRank)}
        if not frozen_a:
            keep |= {id(m.A) for m in model.modules() if isinstance(m, LowRank)}
        total = sum(p.numel() for p in model.parameters())
        base = freeze(model, keep)
        offsets = {name: i for i, (name, _) in enumerate(model.named_parameters())}
        sizes = [p.numel() for p in model.parameters()]
        starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]

        def place(name: str) -> slice | None:
            i = offsets.get(name)
            return None if i is None else slice(starts[i], starts[i + 1])

        pairs = []
        for name, d, k, shape in shapes:
            prefix = f"{name}.parametrizations.weight"
            pairs.append(Pair(name, place(f"{prefix}.0.A"), place(f"{prefix}.0.B"),
                              None if not frozen_a else base.slice_of(f"{prefix}.0.A"),
                              base.slice_of(f"{prefix}.original"), d, k, shape))
        layout = AdapterLayout(tuple(pairs), big, scale, tuple(ranks), starts[-1], base.numel)
        shown = (f"ranks {min(ranks)}-{big} by client" if min(ranks) < big else f"rank {big}")
        counts = " and ".join(f"{n} {kind.__name__}" for kind in ADAPTED  # "3 Linear and 2 Conv2d"
                              if (n := sum(isinstance(m, kind) for _, m in targeted)))
        # adapter.base_from, else the file the model itself loaded (model.pretrained), else its seeded weights
        source = self.base_from or getattr(model, "pretrained_from", None)
        line = (f"LoRA adapters ({shown}, alpha {self.alpha:g}) on {counts} layers"
                f"{', A frozen' if frozen_a else ''}: {starts[-1]} trainable of {total} parameters "
                f"({100 * starts[-1] / total:.2f}%); base {type(model).__name__} frozen ({base.numel} values, "
                f"{'from ' + source if source else 'its seeded initialisation'})")
        return Adapters(layout, base, line)
