"""The dataset's own backbone when the user names no model.

`conf/config.yaml` leaves the `model` group unset (`- model: null`); every dataset YAML names
the backbone its papers train on it with one key, `default_model: NAME` (a `conf/model/`
option; every loader takes it as an argument it ignores, so the dataset node instantiates
as it is). A `model=...` on the command line, in a sweep or in an experiment file always wins;
otherwise the run composes that option here, at the edge, so the resolved config,
summary.json's `choices` and the checkpoint name the model actually trained, exactly as if
the user had typed `model=NAME`.
"""

from __future__ import annotations

import copy
import functools

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import MissingConfigException
from omegaconf import DictConfig, open_dict

from fedagg.edge import CONF

KEY = "default_model"  # the key a dataset YAML names its backbone with


def _model_node(name: str) -> DictConfig:
    # inside a Hydra app (the command line) its own config search path, user folders included
    hydra = GlobalHydra.instance()
    search_path = str(hydra.hydra.config_loader.get_search_path()) if hydra.is_initialized() else None
    return copy.deepcopy(_composed_model_node(name, search_path))


@functools.lru_cache(maxsize=None)
def _composed_model_node(name: str, search_path: str | None) -> DictConfig:
    """Once per process and search path (a sweep's jobs share one). A model file that stands alone (no defaults
    list, no package header: every file in conf/model/) is the node itself, read in a millisecond; another
    is composed as `model=NAME` would compose it, which costs a few tenths of a second (a run's start-up)."""
    if search_path is not None:
        return _read_or_compose(name)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return _read_or_compose(name)


def _read_or_compose(name: str) -> DictConfig:
    loaded = GlobalHydra.instance().config_loader().repository.load_config(f"model/{name}")
    if loaded is not None and not loaded.defaults_list and loaded.header.get("package") in (None, "model") \
            and isinstance(loaded.config, DictConfig):
        return loaded.config
    return compose(config_name="config", overrides=[f"model={name}"]).model


def with_default_model(cfg: DictConfig, choices: dict) -> tuple[DictConfig, str | None]:
    """(the config to run, with `model` filled in from the dataset's `default_model` when none was chosen; the
    line to log about that choice, or None). `choices` gets the model chosen; `cfg` itself is left as it was."""
    if cfg.get("model") is not None:
        return cfg, None
    dataset = cfg.get("dataset")
    default = dataset.get(KEY) if isinstance(dataset, DictConfig) else None
    name = choices.get("dataset") or (str(dataset.get("_target_", "?")).rpartition(".")[2] if dataset else "?")
    if default is None:
        raise ValueError(f"model is not set and dataset={name} names no {KEY}: choose a backbone with model=NAME "
                         f"(the options are the files in conf/model/)")
    try:
        node = _model_node(str(default))
    except MissingConfigException:
        options = ", ".join(sorted(p.stem for p in (CONF / "model").glob("*.yaml")))
        raise ValueError(f"dataset.{KEY}={default!r} of dataset={name} is not a model; choose one of {options}, or "
                         f"set model=NAME") from None
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.model = node
    choices["model"] = str(default)
    return cfg, f"model={default}: the default for dataset={name}; model=NAME to choose another"
