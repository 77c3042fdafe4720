"""FedLAW (Li et al. 2023, ICML, "Revisiting weighted aggregation in FL with neural networks").

The server learns, on a small proxy set of its own, a global shrink factor γ and client
weights λ = softmax(x) so that the model γ Σ_k λ_k W_k has the lowest cross-entropy there.
Only γ and x are trained: the client models are constants, and the
network is evaluated at the merged vector through `torch.func.functional_call`, so the
module's own parameters and buffers are never touched.

Choices taken from the authors' released code (ICML-2023-FedLAW, server_funct.py, the
default `server_funct=exp`, `whether_swa=none`), since fedagg's design leaves them open:
- γ = exp(g) keeps the factor positive; g starts at 0 (γ = 1) and x at log D_k
  (λ = the FedAvg weights; `init_weights: uniform` starts at x = 0), fresh every round, so
  there is no server state.
- Adam with betas (0.5, 0.999), lr 0.01 (their CIFAR-10 value), halved every 20 epochs.
- Shuffled minibatches of the proxy set; BatchNorm normalises with batch statistics (the
  authors train in train mode) on a copy of the global running statistics.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call

from fedagg.aggregators.base import AggregateResult, Aggregator, sample_weights
from fedagg.aggregators.inputs import Needs, RoundInputs
from fedagg.config.constraints import Items, Range, checked

Count = Annotated[int, Range(ge=1, integer=True, words="use an integer >= 1")]
Betas = Annotated[tuple[float, float], Items(Range(ge=0, lt=1), length=2, words="use two numbers in [0, 1), e.g. [0.5, 0.999]")]


class FedLAW(Aggregator):
    """`conf/aggregator/fedlaw.yaml`: new global γ Σ_k λ_k W_k with (γ, λ) fitted on server data."""

    @checked("aggregator.")
    def __init__(
        self,
        proxy_size: Count = 200,
        server_epochs: Count = 100,
        server_lr: Annotated[float, Range(gt=0, lt=float("inf"), words="use a finite number > 0, e.g. 0.01")] = 0.01,
        betas: Betas = (0.5, 0.999),
        server_batch_size: Annotated[int, Range(ge=0, integer=True, words="use an integer >= 0")] = 128,  # 0: all
        lr_decay_every: Count = 20,
        lr_decay: Annotated[float, Range(gt=0, le=1, words="use a number in (0, 1]; 1 keeps the lr fixed")] = 0.5,
        init_weights: Literal["samples", "uniform"] = "samples",
    ) -> None:
        super().__init__()
        # the loop holds the proxy set out of every client; training on it marks the run `uses_extra_data`
        self.needs = Needs(server_samples=proxy_size, server_data=True)
        self.server_epochs = server_epochs
        self.server_lr = float(server_lr)
        self.betas = tuple(float(b) for b in betas)
        self.server_batch_size = server_batch_size  # 0: the whole proxy set
        self.lr_decay_every = lr_decay_every
        self.lr_decay = float(lr_decay)
        self.init_weights = init_weights

    def batches(self, num: int, generator: torch.Generator, device) -> list[list[Tensor]]:
        """Every server epoch's minibatches: a shuffle per epoch seeded by the round (reproducible on resume),
        split evenly so that no batch holds a single sample (BatchNorm in train mode cannot normalise one).
        Drawn on the host in one go and copied to the device once, not once an epoch."""
        if self.server_batch_size == 0 or self.server_batch_size >= num:
            return [[torch.arange(num, device=device)]] * self.server_epochs
        orders = torch.stack([torch.randperm(num, generator=generator) for _ in range(self.server_epochs)]).to(device)
        return [list(order.tensor_split(-(-num // self.server_batch_size))) for order in orders]

    def aggregate(self, inputs: RoundInputs) -> AggregateResult:
        server, layout = inputs.need("server"), inputs.layout
        x_srv, y_srv, model = server.x, server.y, server.model
        W = inputs.client_params.detach()  # constants: only γ and x are learned
        buffers = {name: b.detach().clone() for name, b in server.buffers.items()}  # BatchNorm updates the copies
        D = sample_weights(inputs.num_samples).to(W.device)
        x = (D.log() if self.init_weights == "samples" else torch.zeros_like(D)).requires_grad_(True)
        g = torch.zeros((), device=W.device, requires_grad=True)  # γ = exp(g) = 1 at the start
        opt = torch.optim.Adam([x, g], lr=self.server_lr, betas=self.betas)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=self.lr_decay_every, gamma=self.lr_decay)
        epochs = self.batches(y_srv.numel(), torch.Generator().manual_seed(inputs.round), y_srv.device)
        was_training = model.training
        model.train()  # batch statistics in BatchNorm, as the authors' server training does
        try:
            with torch.enable_grad():
                for batches in epochs:
                    epoch_loss = torch.zeros((), device=W.device)  # proxy-set loss of the last epoch, reported
                    for idx in batches:
                        merged = g.exp() * (torch.softmax(x, dim=0) @ W)  # γ Σ_k λ_k W_k
                        params = {n: merged[s].view(shape) for n, s, shape in zip(layout.names, layout.slices, layout.shapes)}
                        loss = F.cross_entropy(functional_call(model, {**params, **buffers}, (x_srv[idx],)), y_srv[idx])
                        opt.zero_grad()
                        loss.backward()
                        opt.step()
                        epoch_loss += loss.detach() * idx.numel() / y_srv.numel()
                    sched.step()
        finally:
            model.train(was_training)
        lam, gamma = torch.softmax(x.detach(), dim=0), g.detach().exp()
        # new global γ Σ_k λ_k W_k with the learned values
        return AggregateResult(gamma * (lam @ W), lam, metrics={"gamma": float(gamma), "loss": float(epoch_loss)})
