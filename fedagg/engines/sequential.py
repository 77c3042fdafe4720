"""`engine=sequential`: a round's clients trained one after another in a single working model.

Each client runs the local training its trainer defines (fedagg.clients.trainer) as a
stack of one: the same batch plan, loss and SGD arithmetic the parallel engine applies to
many clients at once, with the model's ordinary forward pass. It is the reference.
"""

from __future__ import annotations

import torch

from fedagg.clients.validation import score_model
from fedagg.engines.base import Engine, RoundJob, RoundResult, local_steps, stack_payloads
from fedagg.models.flat import get_buffers, get_params, set_buffers, set_params, unflatten


class SequentialEngine(Engine):
    def train_round(self, job: RoundJob) -> RoundResult:
        """Train `job.clients` from the global weights; score each on `job.val_indices[k]` when given."""
        k_all = len(job.clients)
        # filled a row at a time: a list of K vectors stacked at the end would hold the round's models twice
        params = job.global_params.new_empty(k_all, job.global_params.numel())
        buffers = job.global_buffers.new_empty(k_all, job.global_buffers.numel())
        losses, accs, payloads = [], [], []
        for k in range(k_all):
            set_params(job.model, job.global_params)
            set_buffers(job.model, job.global_buffers)
            loss, payload = self._train_client(job, k)
            losses.append(loss)
            payloads.append(payload)
            params[k] = get_params(job.model)
            buffers[k] = get_buffers(job.model)
            if job.val_indices is not None:
                accs.append(score_model(job.model, job.data, job.val_indices[k], self.eval_batch_size))
        return RoundResult(
            params=params,
            buffers=buffers,
            train_loss=torch.cat(losses),
            val_acc=torch.cat(accs) if job.val_indices is not None else None,
            local_steps=local_steps(job),
            payloads=stack_payloads(payloads),
        )

    def _train_client(self, job: RoundJob, k: int):
        """Client k's local training in `job.model`; (its mean task loss [1], its payload)."""
        trainer, model, client = job.trainer, job.model, job.clients[k]
        budget = job.budget(k)
        plan = trainer.plan([client], job.data, seed=job.seed, round=job.round, budgets=None if budget is None else [budget])
        params = list(model.parameters())
        shapes = [p.shape for p in params]
        sgd = trainer.optimizer([p.data.unsqueeze(0) for p in params], [client], job.lr)  # steps write into the model
        anchor = [a.clone() for a in unflatten(job.global_params, shapes)]
        state = trainer.objective_state([client], job.global_params, shapes)
        state = None if state is None else [s[0] for s in state]
        loss_sum = torch.zeros((), device=job.global_params.device)
        model.train()
        for t in range(len(plan)):
            (n, one), = plan.groups[t]
            x, y = plan.batch(t, n, one)
            total, task = trainer.loss(model(x), y, params, anchor, state)
            grads = torch.autograd.grad(total, params)
            sgd.step([g.unsqueeze(0) for g in grads], one)
            loss_sum += task * n
        trained = get_params(model)
        payload, = trainer.finish(plan, [client], trained.unsqueeze(0), job.global_params, sgd, model, job.lr)
        return trainer.mean_loss(loss_sum.unsqueeze(0), plan), payload
