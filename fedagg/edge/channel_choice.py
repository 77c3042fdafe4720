"""The upload channel as the user chose it, read at the edge where the command line is known.

Hydra records no choice for a group given as a list (`channel=[topk,dp]`) and merges a stage listed
twice into one: the list is read from the overrides, a stage listed twice is refused, and the list is
recorded as the run's channel choice. A stage whose noise is scaled for the uniform mean (DP) takes
`aggregator.weighting=uniform` when the user did not set the weighting on the command line (FedAvg's
default is `samples`); a weighting the user typed is left for the stage to accept or refuse.
"""

from __future__ import annotations

import copy

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf, open_dict

from fedagg.channel.base import Stage


def _parsed(overrides: list[str]) -> list:
    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return []


def channel_choice(overrides: list[str]) -> str | None:
    """The channel's stages a `channel=[...]` override lists, as the run's choice ("topk", "[topk,dp]"); None when
    no override lists them. A stage listed twice is refused."""
    for o in _parsed(overrides):
        if o.key_or_group == "channel" and isinstance(o.value(), list):
            names = [str(v) for v in o.value()]
            twice = next((n for n in names if names.count(n) > 1), None)
            if twice is not None:
                raise ValueError(f"channel=[{','.join(names)}] is not allowed: it lists {twice} twice, and a stage runs "
                                 f"once; list each stage once")
            return None if not names else names[0] if len(names) == 1 else f"[{','.join(names)}]"
    return None


def _typed(overrides: list[str], key: str) -> bool:
    return any(o.key_or_group == key for o in _parsed(overrides))


def _needs_uniform_mean(channel) -> list[str]:
    """The names of the channel's stages whose noise is scaled for the uniform mean."""
    names = []
    for name in channel.keys() if isinstance(channel, DictConfig) else ():
        node = channel.get(name)
        if isinstance(node, DictConfig) and "_target_" in node:
            try:
                stage = get_class(str(node._target_))
            except Exception:  # noqa: BLE001 - a target that does not load is refused, in one line, by the config check
                continue
            if isinstance(stage, type) and issubclass(stage, Stage) and stage.needs_uniform_mean:
                names.append(str(name))
    return names


def uniform_mean_for_privacy(cfg: DictConfig, overrides: list[str]) -> tuple[DictConfig, str | None]:
    """(the config to run, the line saying what changed, or None): `aggregator.weighting=uniform` where a stage
    needs the uniform mean and the command line did not set the weighting."""
    stages = _needs_uniform_mean(cfg.get("channel"))
    aggregator = cfg.get("aggregator")
    if not stages or not isinstance(aggregator, DictConfig) or aggregator.get("weighting") != "samples" \
            or _typed(overrides, "aggregator.weighting") or OmegaConf.is_interpolation(cfg, "aggregator"):
        return cfg, None  # an experiment file's aggregator taken from its table (an interpolation) is as written
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.aggregator.weighting = "uniform"
    return cfg, (f"channel={stages[0]}: aggregator.weighting=uniform, the mean its noise is scaled for (the "
                 f"aggregator's default, samples, is refused with {stages[0]})")
