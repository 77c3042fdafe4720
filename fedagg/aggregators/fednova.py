"""FedNova (Wang et al. 2020, "Tackling the objective inconsistency problem").

Clients that take more local steps move further, and plain averaging lets them pull the
global model toward their own objective. FedNova divides each client's update by a_k,
the weight its local solver gives its gradients over τ_k steps, and rescales the
normalised average by the effective step count τ_eff = Σ_k p_k a_k (p = D):
w ← w + τ_eff Σ_k p_k Δ_k / a_k. With plain SGD a_k = τ_k; with momentum ρ (fresh each
round) a_k = [τ_k − ρ(1 − ρ^τ_k)/(1 − ρ)]/(1 − ρ); with a proximal term μ at local rate η,
a_k = [1 − (1 − η μ)^τ_k]/(η μ). Weight decay is part of the local objective and leaves a_k
alone (as in the authors' code). Equal τ_k with plain SGD is FedAvg exactly.

Two readings of the authors' code (JYWa/FedNova, distoptim/FedNova.py) are options whose
defaults keep fedagg's rule: with a proximal term the code takes τ_eff = Σ_k p_k τ_k, the
plain step counts (`tau_eff: steps`; fedagg's design: Σ_k p_k a_k), and it offers server momentum
`gmf`: v ← gmf v + U/η_l, w ← w + η_l v, with U = Σ_k q_k Δ_k the normalised update and
η_l the clients' learning rate that round (v starts at 0, so gmf = 0 is the plain step).
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from fedagg.aggregators.base import AggregateResult, Aggregator, sample_weights
from fedagg.aggregators.blocks import weighted_update
from fedagg.aggregators.inputs import ClientSetup, Needs, RoundInputs
from fedagg.clients.trainer import LocalSolver
from fedagg.config.constraints import OneOf, Range, Tune, checked, typed

TAU_EFF = ("a", "steps")


def normaliser(steps: Tensor, lr: float, solver: LocalSolver) -> Tensor:
    """a_k [K] (float64) for clients that took `steps` [K] local steps at learning rate `lr`."""
    tau = steps.double()
    rho, mu = solver.momentum, solver.proximal_mu
    if rho > 0:
        return (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)
    if mu > 0:
        return (1 - (1 - lr * mu) ** tau) / (lr * mu)
    return tau


class FedNova(Aggregator):
    """`conf/aggregator/fednova.yaml`: w + Σ_k q_k Δ_k with q_k = p_k τ_eff / a_k; reported weights q / Σ q."""

    needs = Needs(local_steps=True)

    @checked("aggregator.")
    def __init__(self,
                 tau_eff: Annotated[str, OneOf(TAU_EFF, words=f"choose one of {', '.join(TAU_EFF)} (a: Σ p_k a_k, "
                                                          "fedagg's default; steps: Σ p_k τ_k with a proximal term, the authors' code)")] = "a",
                 gmf: Annotated[float, Range(ge=0, lt=1, words="use a number in [0, 1) (0: no server momentum)"),
                                Tune(0.0, 0.9, source="Wang et al. 2020 run gmf 0 and 0.9; the range between")] = 0.0,
                 ) -> None:
        super().__init__("samples")  # p = D (fedagg's choice)
        self.tau_eff, self.gmf = tau_eff, float(gmf)
        self.velocity: Tensor | None = None  # server momentum v [P], in the units of a gradient (U / η_l)

    def check_clients(self, setup: ClientSetup) -> None:
        solver = setup.solver

        def refuse(key: str, value, why: str) -> None:
            raise ValueError(f"{key}={typed(value)} is not allowed with aggregator=fednova: {why}")

        if solver.nesterov:
            refuse("client.nesterov", True, "FedNova's a_k has no formula for Nesterov momentum; use client.nesterov=false")
        if solver.momentum > 0 and solver.proximal_mu > 0:
            refuse("client.momentum", solver.momentum, "a_k has a formula for momentum or for a proximal term, "
                   "not both; use client.momentum=0 with the proximal objective")
        if solver.momentum > 0 and solver.keeps_momentum:
            refuse("client.keep_optimizer_state", True, "a_k with momentum assumes each round starts from a zero "
                   "momentum buffer; use client.keep_optimizer_state=false")

    def aggregate(self, inputs: RoundInputs) -> AggregateResult:
        steps, lr, solver = inputs.need("local_steps"), inputs.need("local_lr"), inputs.need("local_solver")
        a = normaliser(steps, lr, solver)
        # what τ_eff averages: a_k (fedagg's choice), or the step counts when the code's proximal reading is asked for
        t = steps.double() if self.tau_eff == "steps" and solver.proximal_mu > 0 else a
        p = sample_weights(inputs.num_samples).to(a)
        # τ_eff / a_k = Σ_j p_j (t_j / a_k) / Σ_j p_j: written so that equal a_k give a ratio of exactly 1
        # (both sums then add the same numbers in the same order), which makes FedNova FedAvg to the bit
        ratio = (p * (t / a[:, None])).sum(dim=1) / (p * torch.ones_like(a)[:, None]).sum(dim=1)
        q = (p * ratio).to(inputs.client_params.dtype)  # [K] effective weights, summing to τ_eff Σ p_k / a_k
        weights = q / q.sum()
        metrics = {"tau_eff": float((p * t).sum() / p.sum()), "step_scale": float(q.sum())}
        update = weighted_update(q, inputs)
        if self.gmf == 0:
            return AggregateResult(inputs.global_params + update, weights, metrics=metrics)
        # the code's buffer holds U / η_l (its cum_grad over the local lr); the step multiplies η_l back
        scaled = update / lr
        self.velocity = scaled if self.velocity is None else self.gmf * self.velocity.to(scaled) + scaled
        return AggregateResult(inputs.global_params + lr * self.velocity, weights, metrics=metrics)

    def state_dict(self) -> dict:
        return {} if self.velocity is None else {"velocity": self.velocity.clone()}

    def load_state_dict(self, state: dict) -> None:
        velocity = state.get("velocity")
        self.velocity = None if velocity is None else velocity.clone()
