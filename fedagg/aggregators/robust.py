"""What the robust rules share: bucketing, and weights for weights.csv.

A robust rule `combine`s B client models [B, P] (with their sample counts), listed by
ascending client id, into the new global model and says how much each of them counted.
With `bucket_size: s > 1` (Karimireddy et al. 2022) the round's K models are first
shuffled from the stream (seed, "bucketing", round) and averaged in groups of s, so the
rule sees ⌈K/s⌉ bucket means; a client's reported weight is its bucket's weight shared
equally among the bucket.
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from fedagg.aggregators.base import AggregateResult, Aggregator
from fedagg.aggregators.blocks import column_blocks
from fedagg.aggregators.inputs import ClientSetup, RoundInputs
from fedagg.config.constraints import Range, checked
from fedagg.seeding import generator

Count = Annotated[int, Range(ge=1, integer=True, words="use an integer >= 1")]
Positive = Annotated[float, Range(gt=0, lt=float("inf"), words="use a finite number > 0")]


def buckets(k: int, size: int, g: torch.Generator, device) -> Tensor:
    """[B, k] membership: row b averages the clients of bucket b (a shuffle cut into groups of `size`)."""
    groups = torch.randperm(k, generator=g).split(size)
    members = torch.zeros(len(groups), k, device=device)
    for b, group in enumerate(groups):
        members[b, group.to(device)] = 1.0 / len(group)
    return members


class RobustRule(Aggregator):
    """Bucketing and weight reporting; a subclass implements `combine`."""

    @checked("aggregator.")
    def __init__(self, bucket_size: Count = 1) -> None:
        super().__init__("uniform")
        self.bucket_size = bucket_size

    def models_per_round(self, setup: ClientSetup) -> int:
        """The models the rule sees in a full round: its clients, or their buckets when bucketing is on."""
        return -(-setup.clients_per_round // self.bucket_size)

    def check_clients(self, setup: ClientSetup) -> None:
        k = setup.clients_per_round
        if self.bucket_size > 1 and self.bucket_size >= k:  # one bucket: the rule would see the round's mean alone
            raise ValueError(f"aggregator.bucket_size={self.bucket_size} is not allowed with clients_per_round={k}: "
                             f"one bucket would hold every client of a round and the rule would be their plain mean; "
                             f"use a bucket_size below {k}, or 1 for no bucketing")

    def combine(self, inputs: RoundInputs, models: Tensor, num_samples: Tensor) -> tuple:
        """(new global [P], the weight each of the B models counted with [B], summing to 1), and optionally the
        round's diagnostics as a third element ({"name": number}: `agg_<name>` columns)."""
        raise NotImplementedError

    def combine_models(self, inputs: RoundInputs, models, num_samples: Tensor) -> tuple:
        """`combine` on the round's models, which `models(cols)` gives for a column range; a rule that
        works per coordinate overrides this to go through the columns in blocks (CoordinateWise)."""
        return self.combine(inputs, models(slice(None)), num_samples)

    def aggregate(self, inputs: RoundInputs) -> AggregateResult:
        # in ascending client id, so that ties (equal values, equal Krum scores) and buckets follow the ids,
        # never the order the round happened to list its clients in
        order = torch.argsort(inputs.client_ids.to(inputs.client_params.device))
        n = inputs.num_samples.to(device=order.device, dtype=inputs.client_params.dtype)[order]
        members = None
        if self.bucket_size > 1:
            g = generator(inputs.seed, "bucketing", inputs.round)
            members = buckets(inputs.num_clients, self.bucket_size, g, order.device).to(inputs.client_params.dtype)
            n = (members > 0).to(n) @ n

        def models(cols: slice) -> Tensor:  # [B, cols]: the clients' columns, or their buckets' means
            block = inputs.client_params[:, cols][order]
            return block if members is None else members @ block

        new, weights, *metrics = self.combine_models(inputs, models, n)
        if members is not None:
            weights = weights @ members  # a bucket's weight, shared by its members
        return AggregateResult(new, torch.empty_like(weights).index_copy_(0, order, weights),
                               metrics={k: float(v) for m in metrics for k, v in m.items()})


class CoordinateWise(RobustRule):
    """A rule that treats every coordinate on its own (median, trimmed mean): it runs over column blocks of
    the round's models (fedagg.aggregators.blocks), so its sorts never hold the whole round at once."""

    def combine_columns(self, models: Tensor) -> tuple[Tensor, Tensor]:
        """(the new values of these columns [w], how many of its values each of the B models kept [B])."""
        raise NotImplementedError

    def kept_per_coordinate(self, b: int) -> int:
        """How many values a coordinate keeps from b models (a model's weight is its share of them)."""
        raise NotImplementedError

    def combine(self, inputs: RoundInputs, models: Tensor, num_samples: Tensor) -> tuple[Tensor, Tensor]:
        return self.combine_models(inputs, lambda cols: models[:, cols], num_samples)

    def combine_models(self, inputs: RoundInputs, models, num_samples: Tensor) -> tuple[Tensor, Tensor]:
        p = inputs.global_params.numel()
        new, kept = inputs.global_params.new_empty(p), None
        for cols in column_blocks(inputs.num_clients, p, inputs.block_rows):
            new[cols], counts = self.combine_columns(models(cols))
            kept = counts if kept is None else kept + counts
        return new, kept.to(new.dtype) / (p * self.kept_per_coordinate(kept.numel()))


def uniform(b: int, like: Tensor) -> Tensor:
    return torch.full((b,), 1.0 / b, dtype=like.dtype, device=like.device)


def assumed_corrupted(f: int | None, fraction: float, b: int) -> int:
    """f of a round of b inputs: given, or ⌊fraction · b⌋ (the attack's fraction by default)."""
    return f if f is not None else int(fraction * b)
