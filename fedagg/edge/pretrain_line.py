"""`python -m fedagg.pretrain`'s command line: its own keys (PRETRAIN_KEYS: where the base goes and how it is
trained), every other argument a run override composed as `python -m fedagg.run` composes it (model=,
dataset=, data.root=, seed=, device=, model.* and dataset.* keys). A bad key or value is one line before any
training and before the base file is written; an existing base file is never replaced unless overwrite=true."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fedagg.data.device import DeviceData, resolve_device
from fedagg.edge import CONF
from fedagg.edge.command_line import explain_composition_error
from fedagg.loop.splits import build_model
from fedagg.models.pretrained import save_base
from fedagg.pretrain.central import Pretraining, pretrain

# key: (default, what it is): its own keys; `out` is required
PRETRAIN_KEYS = {
    "out": (None, "the base file to write (then model.pretrained=FILE)"),
    "epochs": (1, "passes over the chosen training samples"),
    "lr": (1e-3, "AdamW's learning rate"),
    "batch_size": (64, "samples per step"),
    "weight_decay": (0.01, "AdamW's decoupled weight decay"),
    "classes": (None, "the labels to train on, e.g. [0,1,2,3,4]; null: all"),
    "max_samples": (None, "a seeded subset of that many training samples; null: all"),
    "overwrite": (False, "true: replace an existing base file"),
}
log = logging.getLogger("fedagg.pretrain")


class Refusal(ValueError):
    """A command line that cannot be pretrained as it is; the message is the whole explanation."""


def _own(args: list[str]) -> tuple[dict, list[str]]:
    own, rest = {}, []
    for arg in args:
        key, eq, value = arg.partition("=")
        if eq and key in PRETRAIN_KEYS:
            own[key] = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={value}"]))["v"]
        else:
            rest.append(arg)
    return own, rest


def _int(key: str, value, low: int = 1, none: bool = False) -> int | None:
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise Refusal(f"{key}={value!r} is not allowed; use an integer >= {low}" + (" or null" if none else ""))
    return value


def _plan(own: dict, num_classes: int, seed: int) -> tuple[Path, Pretraining, bool]:
    values = {k: own.get(k, default) for k, (default, _) in PRETRAIN_KEYS.items()}
    if not values["out"]:
        raise Refusal("out is not set; python -m fedagg.pretrain needs out=FILE, the base file to write")
    out = Path(str(values["out"])).expanduser()
    if out.exists() and values["overwrite"] is not True:
        raise Refusal(f"out={values['out']} exists; choose another file, or overwrite=true to replace it")
    folder = next(p for p in (out.absolute(), *out.absolute().parents) if p.exists())
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise Refusal(f"out={values['out']} cannot be written ({folder} is not a writable folder); choose another file")
    for key in ("lr", "weight_decay"):
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (key == "lr" and value == 0):
            raise Refusal(f"{key}={value!r} is not allowed; use a number " + ("> 0" if key == "lr" else ">= 0"))
    classes = values["classes"]
    if classes is not None and (not isinstance(classes, list) or not classes or
                                not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < num_classes
                                        for c in classes)):
        raise Refusal(f"classes={classes!r} is not allowed; use a list of labels from 0 to {num_classes - 1}, "
                      "or null for all")
    plan = Pretraining(epochs=_int("epochs", values["epochs"]), lr=float(values["lr"]),
                       batch_size=_int("batch_size", values["batch_size"]), weight_decay=float(values["weight_decay"]),
                       classes=classes, max_samples=_int("max_samples", values["max_samples"], none=True), seed=seed)
    return out, plan, bool(values["overwrite"])


def run(argv: list[str], say=print) -> Path:
    """Pretrain as the command line `argv` says; returns the base file written."""
    own, overrides = _own(argv)
    model_choice = next((a.split("=", 1)[1] for a in overrides if a.startswith("model=")), None)
    if model_choice is None:
        raise Refusal("model is not set; python -m fedagg.pretrain needs model=NAME (vit_tiny, char_decoder, "
                      "text_decoder: the models with model.pretrained)")
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    except HydraException as err:
        said = explain_composition_error(overrides) or str(err).strip().splitlines()[0]
        raise Refusal(f"{said} (python -m fedagg.pretrain's own keys: {', '.join(PRETRAIN_KEYS)})") from None
    if "pretrained" not in cfg.model:
        raise Refusal(f"model={model_choice} cannot be written as a base; pretrain one of the models with "
                      "model.pretrained (vit_tiny, char_decoder, text_decoder)")
    device = resolve_device(cfg.device)
    bundle = instantiate(cfg.dataset)(root=str(Path(cfg.data.root).expanduser()), download=cfg.data.download)
    out, plan, _ = _plan(own, bundle.num_classes, int(cfg.seed))
    model = build_model(instantiate(cfg.model), bundle, int(cfg.seed), device)
    data = DeviceData(bundle, device, model.input_shape, model=f"model {model_choice}")
    dataset_choice = next((a.split("=", 1)[1] for a in overrides if a.startswith("dataset=")), "digits")
    say(f"pretraining model={model_choice} on dataset={dataset_choice} ({device}) -> {out}")
    stats = pretrain(model, data, plan, say=say)
    save_base(model, out, {"dataset": dataset_choice, "model": model_choice, **stats})
    say(f"base written to {out}: test accuracy {stats['test_acc']:.4f} on {stats['test_samples']} test samples; "
        f"start a run from it with model={model_choice} model.pretrained={out}")
    return out


def main() -> None:
    args = sys.argv[1:]
    if any(a in ("--help", "-h") for a in args):
        print("python -m fedagg.pretrain model=NAME out=FILE [key=value ...]")
        for key, (default, what) in PRETRAIN_KEYS.items():
            print(f"  {key}={default}: {what}")
        print("  any other key=value: as python -m fedagg.run (dataset=, data.root=, seed=, device=, model.*)")
        return
    try:
        run(args)
    except ValueError as err:  # Refusal, and the loaders' and models' own one-line refusals
        print(f"fedagg.pretrain: {err}", file=sys.stderr)
        sys.exit(2)
