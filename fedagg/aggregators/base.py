"""The aggregator contract, with FedAvg semantics as the base (DESIGN "Aggregator").

The round hands a method its participants' updates (`inputs.updates`, Δ_k against the model
each client started from; `fedagg.aggregators.inputs`). `aggregate` runs three steps:

    weights = client_weights(inputs)                  # [K], how clients are weighted
    mean    = inputs.arrived_mean(weighted_update(weights, inputs))   # sum_k p_k Δ_k, then the
                                                      # upload channel's server side (DP's noise)
    params  = server_update(inputs, mean)             # how the mean update is applied

and a method overrides the one step it changes. A step returns its value, or `(value,
{"name": number})` to add per-round diagnostics (a learned factor, a loss): they come back
in `AggregateResult.metrics` and land in `metrics.csv` as `agg_<name>` columns. A method
whose rule is not "weights, then one update" overrides `aggregate` itself and returns its
weights and metrics the same way ([K], summing to 1; element-wise rules report each client's
mean weight). Everything is returned, never left on the object, so that a method cannot
forget to report its weights and have the loop show another's.

What a method needs beyond the always-present fields of `RoundInputs` it declares in
`needs`; what a participant receives and sends, in bits, in `bits(num_params)` (dense 32-bit
parameters here; a method that compresses or sends more overrides it). State that must
survive a resume goes in `state_dict()`; per-client state is keyed by the client's global
id (`inputs.client_ids`), never by its position in this round's sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypeVar, get_args

import torch
from torch import Tensor

from fedagg.aggregators.blocks import weighted_update
from fedagg.aggregators.inputs import Bits, ClientSetup, Needs, RoundInputs, dense
from fedagg.clients.store import ClientStore
from fedagg.config.constraints import checked
from fedagg.config.names import Named
from fedagg.models.adapters.layout import AdapterLayout, sent_values

Weighting = Literal["samples", "uniform"]  # p = D, or 1/K
WEIGHTINGS = get_args(Weighting)


@dataclass(frozen=True)
class AggregateResult:
    """What one `aggregate` call produced.

    params: [P] the new global parameters (what clients receive next round).
    weights: [K] each participant's weight, non-negative, summing to 1 (weights.csv).
    buffer_weights: [K] or [K, B] weights for the BatchNorm buffers; None: `weights`.
    evaluated: [P] the parameters the test set scores, when the method's paper scores
    another model than `params` (FedNNNN's plain average); None: `params`.
    metrics: the round's diagnostics by name (FedExP's server rate): `agg_<name>` columns of metrics.csv.
    buffers: [B] the new global buffers when the rule makes them itself (FedAsync mixes them with the global
    ones); None: the participants' combined by `weights_for_buffers()`.
    base_update: [Q] what the rule adds to the frozen base under the adapters (adapter=lora; FLoRA merges the
    clients' products into it, FedEx-LoRA its residual); None: the base stays as it is.
    """

    params: Tensor
    weights: Tensor
    buffer_weights: Tensor | None = None
    evaluated: Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    buffers: Tensor | None = None
    base_update: Tensor | None = None

    def weights_for_buffers(self) -> Tensor:
        return self.weights if self.buffer_weights is None else self.buffer_weights

    def tested_params(self) -> Tensor:
        return self.params if self.evaluated is None else self.evaluated


T = TypeVar("T")


def measured(value: T | tuple[T, dict[str, float]]) -> tuple[T, dict[str, float]]:
    """(a step's value, its diagnostics as floats): a step returns its value alone or with a dict of them."""
    if isinstance(value, tuple):
        value, metrics = value
        return value, {k: float(v) for k, v in metrics.items()}
    return value, {}


def sample_weights(num_samples: Tensor) -> Tensor:
    """D_k = n_k / sum_j n_j, as float on the samples' device."""
    n = num_samples.to(torch.float32)
    return n / n.sum()


class Aggregator(metaclass=Named):
    """FedAvg (McMahan 2017): w + sum_k p_k (W_k - w), p = D (samples) or 1/K (uniform)."""

    needs: Needs = Needs()
    display_name: ClassVar[str | None] = None  # `display_name: ...` in the method's YAML; None: the option's name
    # True: the new model is a server step on sum_k p_k Delta_k with p fixed before any update is seen
    # (weighting=uniform gives p = 1/K): channel=dp's noise on that mean is then all the server reveals.
    # Opt-in: a rule that looks at the updates (Krum, medians, FedAdp, FedExP's step size) keeps False.
    weighted_mean: ClassVar[bool] = False
    # True: the rule compresses each upload itself (FedCAMS), so a compressing channel would compress it twice;
    # `same_uncompressed` names the option that is the rule without its own compression, as the user types it
    compresses_uploads: ClassVar[bool] = False
    same_uncompressed: ClassVar[str] = ""
    # True: a rule of an asynchronous server (`server=async`: FedAsync, FedBuff; fedagg.aggregators.asynchronous),
    # which steps on arrivals as they come; a synchronous rule runs only under `server=sync`, and the reverse
    asynchronous: ClassVar[bool] = False

    @checked("aggregator.")
    def __init__(self, weighting: Weighting = "samples") -> None:
        self.weighting = weighting

    def check_clients(self, setup: ClientSetup) -> None:
        """Refuse, before any training, clients this method has no rule for (FedNova: Nesterov; Krum: too few)."""

    def bits(self, num_params: int) -> Bits:
        """What one participant receives (the global model) and sends back (its trained model) in a round:
        `num_params` 32-bit floats each way. Per-client scalars (sample and step counts, a validation
        score) are not counted: a few words next to a model."""
        return Bits(down=dense(num_params), up=dense(num_params))

    def client_rank(self, adapters: AdapterLayout, client: int) -> int:
        """The adapter rank client `client` holds now (adapter=lora): its configured one unless the rule changes it
        (HetLoRA's pruning)."""
        return adapters.client_ranks[client]

    def adapter_values(self, adapters: AdapterLayout, client: int, reported: Sequence[int]) -> tuple[int, int]:
        """(values client `client` receives, values it sends) of the adapters, before `bits` prices them: its own
        rank's factors both ways, not the padded flat vector. `reported`: the round's reporting clients."""
        n = sent_values(adapters, self.client_rank(adapters, client))
        return n, n

    def client_weights(self, inputs: RoundInputs) -> Tensor | tuple[Tensor, dict[str, float]]:
        """[K] non-negative weights summing to 1 (with diagnostics, if any: see the module)."""
        if self.weighting == "uniform":
            k = inputs.num_clients
            return torch.full((k,), 1.0 / k, device=inputs.num_samples.device)
        return sample_weights(inputs.num_samples)

    def server_update(self, inputs: RoundInputs, update: Tensor) -> Tensor | tuple[Tensor, dict[str, float]]:
        """Apply the weighted mean update sum_k p_k Delta_k (after the channel's server side) to the global
        parameters (with diagnostics, if any: see the module)."""
        return inputs.global_params + update

    def aggregate(self, inputs: RoundInputs) -> AggregateResult:
        """The new global parameters [P], the weights [K] that made them (buffers follow the weights) and the
        steps' diagnostics."""
        weights, metrics = measured(self.client_weights(inputs))
        weights = weights.to(inputs.client_params.dtype)
        update = inputs.arrived_mean(weighted_update(weights, inputs))
        params, more = measured(self.server_update(inputs, update))
        return AggregateResult(params, weights, metrics={**metrics, **more})

    def channel_stages(self) -> list:
        """Upload-channel stages (fedagg.channel) the rule consists of, such as FedCAMS's compression with error
        feedback: the run's assembly puts them in the channel right after the attack. None by default."""
        return []

    def client_stores(self) -> dict[str, ClientStore]:
        """Per-client state the server half keeps by client id (fedagg/clients/store.py), by name: the run
        loop gives each a folder in the run directory. None by default."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class FedAvg(Aggregator):
    """`conf/aggregator/fedavg.yaml`; the base class already is FedAvg."""

    weighted_mean = True
