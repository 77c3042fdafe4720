"""The one provider of what aggregators declare they need (`Needs`) beyond the parameters.

It reads the aggregator's declaration once, refuses a setup that cannot supply it before
any training, and each round fills exactly the declared fields of `RoundInputs`: where
each trained client model is scored, label histograms, the server's data, local step
counts, the payloads of the method's client half and the clients' parameter sensitivities
(which local training measures: `connect` tells it to).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from fedagg.aggregators.inputs import Needs, RoundInputs, ServerData
from fedagg.clients.client import ClientData
from fedagg.clients.trainer import LocalSolver
from fedagg.engines.base import RoundResult
from fedagg.clients.validation import score_model
from fedagg.data.device import targets
from fedagg.models.adapters import Adapters
from fedagg.models.flat import ParamLayout, set_buffers, set_params


def check_needs(needs: Needs, clients: list[ClientData], server_idx: Tensor, val_frac: float, name: str) -> None:
    """Fail before training when this setup cannot give the aggregator what it declared."""
    if (needs.server_data or needs.val_acc == "server") and server_idx.numel() == 0:
        raise ValueError(f"aggregator {name} needs server data but no server split was held out")
    if needs.val_acc == "local" and any(c.val_idx.numel() == 0 for c in clients):
        raise ValueError(
            f"aggregator {name} weights clients by validation accuracy (val_source=local), but "
            f"client.val_frac={val_frac}; set client.val_frac to a fraction in (0, 1), e.g. 0.1, "
            "or leave it null to get 0.1"
        )


class InputsProvider:
    def __init__(self, needs: Needs, *, data, model: nn.Module, clients: list[ClientData], server_idx: Tensor,
                 solver: LocalSolver, seed: int, adapters: Adapters | None = None) -> None:
        self.needs, self.data, self.model, self.clients, self.solver = needs, data, model, clients, solver
        self.seed = seed
        self.server_idx = server_idx
        self.adapters = Adapters.none() if adapters is None else adapters
        self.layout = replace(ParamLayout.of(model), adapters=self.adapters.layout)
        self.all_num_samples = torch.tensor([c.num_samples for c in clients], device=data.device)
        self.label_hist = self._label_histograms() if needs.label_hist else None
        self.server_x = data.prepare(data.train_x[server_idx]) if needs.server_data else None

    def _label_histograms(self) -> Tensor:
        """[num_clients, C] class counts of every client's training samples."""
        labels = self.data.train_y
        return torch.stack([torch.bincount(labels[c.train_idx], minlength=self.data.num_classes)
                            for c in self.clients]).float()

    def val_indices(self, chosen: list[ClientData]) -> list[Tensor] | None:
        """Where each participant's trained model is scored, when the aggregator declared val_acc."""
        if self.needs.val_acc == "server":
            return [self.server_idx] * len(chosen)
        if self.needs.val_acc == "local":
            return [c.val_idx for c in chosen]
        return None

    def rescore(self, result: RoundResult, rows: list[int], batch_size: int) -> None:
        """Score again, on the server's split, the models of `rows` that changed after local training (a model
        attack): what the server validates is what it received. Each client scored on its own split reports
        the accuracy of the model it trained."""
        if self.needs.val_acc != "server":
            return
        for k in rows:
            set_params(self.model, result.params[k])
            set_buffers(self.model, result.buffers[k])
            result.val_acc[k] = score_model(self.model, self.data, self.server_idx, batch_size)[0]

    def _server(self, buffers: Tensor) -> ServerData:
        set_buffers(self.model, buffers)  # the global statistics, as named tensors
        copies = {name: b.detach().clone() for name, b in self.model.named_buffers()}
        return ServerData(x=self.server_x, y=targets(self.data, "train", self.server_idx), model=self.model, buffers=copies)

    def inputs(self, params: Tensor, buffers: Tensor, result: RoundResult, ids: list[int], round: int,
               lr: float, block_rows: int | None = None, on_mean=None, start_params: Tensor | None = None,
               staleness: Tensor | None = None) -> RoundInputs:
        """`on_mean`: the upload channel's server side for this round (`fedagg.channel.chain.ServerSide`);
        `start_params` [K, P] and `staleness` [K]: each arrival's start model and age on an asynchronous server."""
        needs = self.needs
        hist = self.label_hist
        return RoundInputs(
            global_params=params,
            client_params=result.params,
            num_samples=self.all_num_samples[ids],
            client_ids=torch.tensor(ids, device=params.device),
            round=round,
            layout=self.layout,
            all_num_samples=self.all_num_samples,
            seed=self.seed,
            val_acc=result.val_acc if needs.val_acc else None,
            label_hist=hist[ids] if hist is not None else None,
            global_label_hist=hist.sum(0) if hist is not None else None,
            server=self._server(buffers) if needs.server_data else None,
            local_steps=result.local_steps if needs.local_steps else None,
            local_lr=lr if needs.local_steps else None,
            local_solver=self.solver if needs.local_steps else None,
            global_buffers=buffers if needs.buffers else None,
            client_buffers=result.buffers if needs.buffers else None,
            payloads=result.payloads,
            sensitivity=result.sensitivity if needs.sensitivity else None,
            block_rows=block_rows,
            start_params=start_params,
            staleness=staleness,
            on_mean=on_mean,
            # a copy of the base only where a rule reads its values (FFA-LoRA's frozen A): it can be most of the memory
            base=self.adapters.base.vector().to(params.device) if needs.frozen_a else None,
        )
