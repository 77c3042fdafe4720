"""FedBN (Li et al., ICLR 2021; med-air/FedBN@2fa38ad): normalisation
layers stay with each client, one method with two halves (`aggregator=fedbn`).

What stays local is chosen by layer type: the weights, biases and running statistics of every
BatchNorm, InstanceNorm, GroupNorm and LayerNorm (the authors select the state-dict keys holding
"bn"). The client half keeps them per client id in a `ClientStore` and puts them into the global
model a client starts from (a client never trained starts from the initial model's); the client
trains all its parameters. The server averages every parameter with the weighting (the authors:
uniform over clients that all take part; fedagg's `weighting` applies, `samples` by default), so
only the other layers reach the clients. The global model the test set scores is that average,
normalisation layers included, with the participants' statistics averaged by the same weights;
with `eval.per_client=true` each client is scored with its own normalisation layers on its own
test split (the model it would start from).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fedagg.aggregators.base import Aggregator, Weighting
from fedagg.aggregators.inputs import Needs
from fedagg.clients.objectives import LocalWork, Objective
from fedagg.clients.store import ClientStore
from fedagg.config.constraints import checked
from fedagg.models.flat import get_buffers, get_params

NORMS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)  # _NormBase: BatchNorm*, InstanceNorm*


def local_masks(model: nn.Module) -> tuple[Tensor, Tensor]:
    """[P] and [B] bool: which entries of the flat parameters and buffers belong to normalisation layers."""
    norm = {name for name, module in model.named_modules() if isinstance(module, NORMS)}

    def mask(named) -> Tensor:
        parts = [torch.full((t.numel(),), name.rpartition(".")[0] in norm, dtype=torch.bool) for name, t in named]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool)

    device = next(model.parameters()).device
    return mask(model.named_parameters()).to(device), mask(model.named_buffers()).to(device)


class FedBNClient(Objective):
    """Client half: per client id its normalisation layers' parameters and buffers, flat [L_P + L_B]."""

    def __init__(self) -> None:
        self.local = ClientStore()  # client id -> its normalisation layers after its last training
        self.param_mask: Tensor | None = None
        self.buffer_mask: Tensor | None = None
        self.initial: Tensor | None = None  # the initial model's normalisation layers, for clients never trained

    def setup(self, model: nn.Module) -> None:
        self.param_mask, self.buffer_mask = local_masks(model)
        if not bool(self.param_mask.any()) and not bool(self.buffer_mask.any()):
            raise ValueError(f"aggregator=fedbn keeps normalisation layers local, but model {type(model).__name__} "
                             "has none (BatchNorm, InstanceNorm, GroupNorm, LayerNorm); choose a model with them, "
                             "e.g. model=cnn_bn")
        self.initial = self._local(get_params(model), get_buffers(model))

    def _local(self, params: Tensor, buffers: Tensor) -> Tensor:
        return torch.cat([params[self.param_mask], buffers[self.buffer_mask].to(params.dtype)])

    def start(self, client_id: int, params: Tensor, buffers: Tensor) -> tuple[Tensor, Tensor]:
        kept = self.local.get(client_id)
        kept = (self.initial if kept is None else kept).to(params.device)
        split = int(self.param_mask.sum())
        params, buffers = params.clone(), buffers.clone()
        params[self.param_mask] = kept[:split]
        buffers[self.buffer_mask] = kept[split:].to(buffers.dtype)
        return params, buffers

    def after_training(self, client_id: int, trained: Tensor, global_params: Tensor, work: LocalWork) -> None:
        self.local.put(client_id, self._local(trained, work.buffers))

    def client_stores(self) -> dict[str, ClientStore]:
        return {"fedbn_local_layers": self.local}

    def state_dict(self) -> dict:
        return {"local": self.local.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.local.load_state_dict(state["local"])


class FedBN(Aggregator):
    """`conf/aggregator/fedbn.yaml`: FedAvg's average, sent to the clients without the normalisation layers they
    keep (the client half puts their own back)."""

    @checked("aggregator.")
    def __init__(self, weighting: Weighting = "samples", client: FedBNClient | None = None) -> None:
        super().__init__(weighting)
        self.client = FedBNClient() if client is None else client
        self.needs = Needs(client_half=self.client)
