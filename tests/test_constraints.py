"""Ranges and choices declared once, in a constructor's signature, read by the config check and by the constructor."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from conftest import compose_config
from fedagg.aggregators.fedlaw import FedLAW
from fedagg.aggregators.median import Median
from fedagg.config.constraints import Flag, Items, Range, checked
from fedagg.config.schema import check_config, check_node
from fedagg.run import GROUPS


class Rule:
    @checked("aggregator.")
    def __init__(self, beta: Annotated[float, Range(ge=0, lt=0.5)] = 0.1,
                 steps: Annotated[int, Range(gt=0, integer=True)] | None = None,
                 pair: Annotated[tuple[float, float], Items(Range(ge=0, le=1), length=2)] = (0.5, 0.5),
                 on: Annotated[bool, Flag()] = True, mode: Literal["a", "b"] = "a",
                 scale: Annotated[float, Range(gt=0, finite=True, words="use a scale > 0, e.g. 2")] = 1.0) -> None:
        self.beta = beta


# (values, the constructor's line, the config check's line when its type check speaks first, else the same)
LINES = [
    ({"beta": 0.5}, "aggregator.beta=0.5 is not allowed; it must be a number in [0, 0.5)", None),
    ({"beta": True}, "aggregator.beta=true is not allowed; it must be a number in [0, 0.5)",
     "aggregator.beta=true is not allowed; it must be a number"),
    ({"beta": float("nan")}, "aggregator.beta=nan is not allowed; it must be a number in [0, 0.5)",
     "aggregator.beta=nan is not allowed; it must be a finite number"),
    ({"steps": 0}, "aggregator.steps=0 is not allowed; it must be an integer > 0", None),
    ({"steps": 2.0}, "aggregator.steps=2.0 is not allowed; it must be an integer > 0",
     "aggregator.steps=2.0 is not allowed; it must be an integer or null"),
    ({"pair": [0.5]}, "aggregator.pair=[0.5] is not allowed; 2 items, each: a number in [0, 1]", None),
    ({"pair": "ab"}, "aggregator.pair='ab' is not allowed; 2 items, each: a number in [0, 1]", None),
    ({"on": 1}, "aggregator.on=1 is not allowed; it must be true or false", None),
    ({"mode": "c"}, "aggregator.mode='c' is not allowed; choose one of a, b", None),
    ({"scale": float("inf")}, "aggregator.scale=inf is not allowed; use a scale > 0, e.g. 2",
     "aggregator.scale=inf is not allowed; it must be a finite number"),
]


@pytest.mark.parametrize("values, line, config_line", LINES, ids=[f"{next(iter(v))}{i}" for i, (v, *_) in enumerate(LINES)])
def test_constructor_and_config_check_refuse_in_one_line(values, line, config_line):
    with pytest.raises(ValueError) as built:
        Rule(**values)
    assert str(built.value) == line
    node = OmegaConf.create({"_target_": f"{__name__}.Rule", **values})
    with pytest.raises(ValueError) as checked_config:
        check_node(node, "aggregator.")
    assert str(checked_config.value) == (config_line or line)


def test_none_passes_only_where_the_annotation_admits_it():
    assert Rule(steps=None).beta == 0.1
    with pytest.raises(ValueError, match=r"^aggregator\.beta=null is not allowed"):
        Rule(beta=None)


def test_a_declared_range_is_refused_by_the_config_check_before_anything_is_built():
    cfg = compose_config("aggregator=median", "aggregator.bucket_size=0")
    with pytest.raises(ValueError) as err:
        check_config(cfg, GROUPS)
    assert str(err.value) == "aggregator.bucket_size=0 is not allowed; use an integer >= 1"
    with pytest.raises(ValueError) as err:
        Median(bucket_size=0)
    assert str(err.value) == "aggregator.bucket_size=0 is not allowed; use an integer >= 1"


def test_lists_arrive_plain_and_an_omegaconf_list_is_still_accepted():
    cfg = compose_config("aggregator=fedlaw", "aggregator.betas=[0.25,0.5]")
    converted = instantiate(cfg.aggregator, _convert_="all")
    assert isinstance(converted, FedLAW) and converted.betas == (0.25, 0.5)
    assert instantiate(cfg.aggregator).betas == (0.25, 0.5)  # DESIGN: a plain instantiate gives a ready object
    with pytest.raises(ValueError) as err:
        check_config(compose_config("aggregator=fedlaw", "aggregator.betas=[0.25,1.0]"), GROUPS)
    assert str(err.value) == "aggregator.betas=[0.25, 1.0] is not allowed; use two numbers in [0, 1), e.g. [0.5, 0.999]"
