"""Pretrained bases of fedagg's own models: the file `python -m fedagg.pretrain` writes and
`model.pretrained=PATH` reads.

A base file holds the model's class, its architecture (the constructor arguments that shape its
weights) and its state_dict. Loading refuses, in one line naming the key, a base whose class or
architecture differs from the model being built, because a silently partial load would fine-tune
a mostly random network. The one part allowed to differ is the classifier (the last linear
layer): a base pretrained for other classes keeps its body and gets a fresh head of the run's
own classes, drawn from the run's initialisation stream.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)

FORMAT = "fedagg-base/1"
HOW = "make one with python -m fedagg.pretrain (docs/bases.md)"


def class_path(model: nn.Module) -> str:
    return f"{type(model).__module__}.{type(model).__qualname__}"


def save_base(model: nn.Module, path: str | os.PathLike, source: dict) -> Path:
    """Write `model` (which names its architecture in `model.arch`) as a base file; `source` says what it was
    trained on (recorded, for the user). Written whole or not at all."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    torch.save({"format": FORMAT, "class": class_path(model), "arch": dict(model.arch),
                "num_classes": int(model.last_layer.out_features), "source": source, "state_dict": state}, tmp)
    os.replace(tmp, path)
    return path


def read_base(path: str | os.PathLike) -> dict:
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"model.pretrained={str(path)!r}: no such file; {HOW}")
    try:
        base = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - unpickling a foreign or damaged file raises almost anything
        raise ValueError(f"model.pretrained={str(path)!r} is not a readable base file ({type(err).__name__}); "
                         f"{HOW}") from None
    if not isinstance(base, dict) or base.get("format") != FORMAT:
        raise ValueError(f"model.pretrained={str(path)!r} is not a fedagg base file ({FORMAT}); {HOW}")
    return base


def load_base(model: nn.Module, path: str | os.PathLike) -> None:
    """Copy the base at `path` into `model` (built with the architecture it was pretrained with)."""
    base = read_base(path)
    if base["class"] != class_path(model):
        raise ValueError(f"model.pretrained={str(path)!r} holds a {base['class'].rpartition('.')[2]}, not the "
                         f"{type(model).__name__} this model= builds; choose the model it was pretrained as")
    differ = [f"model.{k}={model.arch.get(k)!r} (the base has {v!r})" for k, v in base["arch"].items()
              if model.arch.get(k) != v]
    if differ:
        raise ValueError(f"model.pretrained={str(path)!r} was pretrained with another architecture: "
                         f"{', '.join(differ)}; set those keys to the base's values")
    state = dict(base["state_dict"])
    head = model.classifier_name
    own = model.state_dict()
    if any(state[f"{head}.{p}"].shape != own[f"{head}.{p}"].shape for p in ("weight", "bias")):
        log.info("model.pretrained: the base classified %d classes, this run %d; its classifier starts fresh",
                 base["num_classes"], model.last_layer.out_features)
        for p in ("weight", "bias"):
            state[f"{head}.{p}"] = own[f"{head}.{p}"]
    model.load_state_dict(state)
    model.pretrained_from = str(path)  # what the start-up lines name as the model's weights
