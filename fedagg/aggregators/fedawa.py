"""FedAWA and FedAWA-L (Shi et al., CVPR 2025): aggregation weights learned on the server.

Every client id owns logits T that persist across rounds (one for FedAWA, one per parameter
tensor for FedAWA-L). Each round, over the participants S: λ = softmax(T_S); the loss of
Eq. (3)/(4) rewards clients whose client vector τ_k = Δ_k lies near the merged vector
τ_g = Σ λ_k τ_k and whose model stays near the global one; a fresh Adam takes
`server_steps` steps on T_S; the new global is Σ λ_k W_k / Σ λ_k with the λ from before
the step. FedAWA is FedAWA-L with the whole vector as its one layer, so both share one path.
Options from the authors' code, off by default: `server_optimizer: sgd` (SGD with momentum
and weight decay on T instead of Adam) and `gamma`, a scale on the new global.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from torch import Tensor

from fedagg.aggregators.base import AggregateResult, Aggregator
from fedagg.aggregators.fedlaw import Betas
from fedagg.aggregators.inputs import RoundInputs
from fedagg.config.constraints import Flag, Range, checked
from fedagg.models.flat import ParamLayout

# the authors' code (github.com/ChanglongShi/FedAWA, server_funct.py `fedawa`): a fresh optimizer on T every round
SERVER_OPTIMIZERS = {"adam": 1e-3, "sgd": 1e-2}  # name -> its learning rate there
COS_EPS = 1e-8  # guards cos(w, W_k) of an all-zero layer (e.g. a BatchNorm bias at init) -> cos = 0
NonNegative = Annotated[float, Range(ge=0, lt=float("inf"), words="use a finite number >= 0")]


class FedAWA(Aggregator):
    """`conf/aggregator/fedawa.yaml`: one learned logit per client id."""

    @checked("aggregator.")
    def __init__(
        self,
        server_lr: Annotated[float, Range(gt=0, lt=float("inf"), words="use a finite number > 0, e.g. 1e-3, or null")]
        | None = None,
        betas: Betas = (0.5, 0.999),
        server_steps: Annotated[int, Range(ge=1, integer=True, words="use an integer >= 1")] = 1,
        reg: Literal["cos", "euclid", "none"] = "cos",
        use_updated: Annotated[bool, Flag("use true or false")] = False,
        server_optimizer: Literal["adam", "sgd"] = "adam",  # SERVER_OPTIMIZERS
        momentum: NonNegative = 0.9,
        weight_decay: NonNegative = 5e-4,
        gamma: Annotated[float, Range(gt=0, lt=float("inf"), words="use a finite number > 0 (1: no scaling)")] = 1.0,
    ) -> None:
        super().__init__()
        if server_lr is None:
            server_lr = SERVER_OPTIMIZERS[server_optimizer]
        self.server_lr, self.betas, self.server_steps = float(server_lr), tuple(float(b) for b in betas), server_steps
        self.reg, self.use_updated = reg, use_updated
        self.server_optimizer, self.momentum, self.weight_decay = server_optimizer, float(momentum), float(weight_decay)
        self.gamma = float(gamma)
        self.logits: dict[int, Tensor] = {}  # client id -> [L] logits, L = number of layers

    def layers(self, layout: ParamLayout, num_params: int) -> list[slice]:
        return [slice(0, num_params)]

    def participant_logits(self, ids: list[int], all_num_samples: Tensor, num_layers: int, device) -> Tensor:
        """[K, L] logits of this round's participants; a client seen for the first time starts at n_k / Σ n
        over ALL clients (fedagg's choice), by global id."""
        n = all_num_samples.to(device=device, dtype=torch.float32)
        frac = n[torch.tensor(ids, device=device)] / n.sum()
        for k, cid in enumerate(ids):
            if cid not in self.logits:
                self.logits[cid] = frac[k].expand(num_layers).clone()
        return torch.stack([self.logits[cid].to(device) for cid in ids])

    def drift(self, w: Tensor, W: Tensor, layers: list[slice]) -> Tensor:
        """[K, L] second term of Eq. (3)/(4), d(w, W_k) per layer; it does not depend on λ."""
        if self.reg == "none":
            return W.new_zeros(W.shape[0], len(layers))
        if self.reg == "euclid":
            return torch.stack([(W[:, s] - w[s]).pow(2).mean(dim=1) for s in layers], dim=1)
        cos = [W[:, s] @ w[s] / (torch.linalg.vector_norm(W[:, s], dim=1) * torch.linalg.vector_norm(w[s])).clamp_min(COS_EPS) for s in layers]
        return 1 - torch.stack(cos, dim=1)

    @staticmethod
    def loss(T: Tensor, tau: Tensor, drift: Tensor, layers: list[slice]) -> Tensor:
        lam = torch.softmax(T, dim=0)  # softmax over clients, per layer
        # ‖τ_k − τ_g‖₂ per layer, τ_g = Σ λ_k τ_k (Eq. 1); vector_norm's gradient at 0 is 0, so identical clients stay finite
        spread = torch.stack([torch.linalg.vector_norm(tau[:, s] - lam[:, l] @ tau[:, s], dim=1) for l, s in enumerate(layers)], dim=1)
        return (lam * (spread + drift)).sum()  # Eq. (3); Eq. (4) sums the same terms over layers

    def aggregate(self, inputs: RoundInputs) -> AggregateResult:
        global_params, client_params = inputs.global_params, inputs.client_params
        layers = self.layers(inputs.layout, global_params.numel())
        ids = [int(i) for i in inputs.client_ids.tolist()]
        T0 = self.participant_logits(ids, inputs.all_num_samples, len(layers), client_params.device)
        lam = torch.softmax(T0, dim=0)  # [K, L] weights used for this round's aggregate
        tau = inputs.updates  # client vectors τ_k = Δ_k (Eq. 1)
        drift = self.drift(global_params, client_params, layers)
        T = T0.clone().requires_grad_(True)
        opt = self.optimizer(T)  # fresh each round (Algorithm 1)
        with torch.enable_grad():
            for step in range(self.server_steps):
                opt.zero_grad()
                loss = self.loss(T, tau, drift, layers)
                loss.backward()
                opt.step()
                if step == 0:
                    metrics = {"loss": float(loss.detach())}
        T = T.detach()
        for k, cid in enumerate(ids):
            self.logits[cid] = T[k].clone()
        if self.use_updated:
            lam = torch.softmax(T, dim=0)
        weights = lam.mean(dim=1)  # FedAWA-L reports each client's mean weight over layers
        new = torch.empty_like(global_params)
        for l, s in enumerate(layers):
            new[s] = lam[:, l] @ client_params[:, s] / lam[:, l].sum()  # Σ λ_k W_k / Σ λ_k, per layer
        if self.gamma != 1.0:
            new *= self.gamma  # the authors' code's `gamma` ("vector_scale"), 1 there by default; buffers too
        # buffers: λ, scaled by `gamma` as the authors' code scales every entry of the state, statistics included
        return AggregateResult(new, weights, buffer_weights=self.gamma * weights, metrics=metrics)

    def optimizer(self, T: Tensor) -> torch.optim.Optimizer:
        if self.server_optimizer == "sgd":
            return torch.optim.SGD([T], lr=self.server_lr, momentum=self.momentum, weight_decay=self.weight_decay)
        return torch.optim.Adam([T], lr=self.server_lr, betas=self.betas)

    def state_dict(self) -> dict:
        return {"logits": {cid: t.clone() for cid, t in self.logits.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.logits = {int(cid): t.clone() for cid, t in state["logits"].items()}


class FedAWAL(FedAWA):
    """`conf/aggregator/fedawa_l.yaml`: one learned logit per (client id, parameter tensor), Eq. (4)."""

    def layers(self, layout: ParamLayout, num_params: int) -> list[slice]:
        if layout.num_params != num_params:
            raise ValueError(f"fedawa_l: the layout covers {layout.num_params} parameters but the vectors have {num_params}")
        return layout.slices
