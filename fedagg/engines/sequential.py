"""`engine=sequential`: a round's clients trained one after another in a single working model.

Each client runs the local training its trainer defines (fedagg.clients.trainer) as a
stack of one: the same batch plan, loss and SGD arithmetic the parallel engine applies to
many clients at once, with the model's ordinary forward pass. It is the reference.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fedagg.clients.forward import frozen_call
from fedagg.clients.validation import score_model
from fedagg.seeding import global_rng, stream_seed
from fedagg.engines.base import Engine, RoundJob, RoundResult, local_steps, stack_payloads
from fedagg.models.base import Representation
from fedagg.models.flat import get_buffers, get_params, set_buffers, set_params


class SequentialEngine(Engine):
    def train_round(self, job: RoundJob) -> RoundResult:
        """Train `job.clients` from the global weights; score each on `job.val_indices[k]` when given."""
        k_all = len(job.clients)
        # filled a row at a time: a list of K vectors stacked at the end would hold the round's models twice
        params = job.global_params.new_empty(k_all, job.global_params.numel())
        buffers = job.global_buffers.new_empty(k_all, job.global_buffers.numel())
        losses, accs, payloads, sensitivities = [], [], [], []
        for k in range(k_all):
            start = job.trainer.starts([job.clients[k]], job.global_params, job.global_buffers)
            set_params(job.model, job.global_params if start is None else start[0][0])
            set_buffers(job.model, job.global_buffers if start is None else start[1][0])
            # what the model draws from torch's global generator (dropout's masks) comes from the client's own
            # stream, as its batches do: a run's seed determines it, whatever ran before in the process
            draws = stream_seed(job.seed, "training_draws", job.draw(k), job.clients[k].id)
            with global_rng(draws, job.global_params.device):
                loss, payload, sensitivity = self._train_client(job, k)
            losses.append(loss)
            payloads.append(payload)
            sensitivities.append(sensitivity)
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
            sensitivity=None if sensitivities[0] is None else torch.cat(sensitivities),
        )

    def _train_client(self, job: RoundJob, k: int):
        """Client k's local training in `job.model`; (its mean task loss [1], its payload, its sensitivity [1, ...]
        or None)."""
        trainer, model, client = job.trainer, job.model, job.clients[k]
        budget = job.budget(k)
        plan = trainer.plan([client], job.data, seed=job.seed, round=job.draw(k),
                            budgets=None if budget is None else [budget])
        params, templates = list(model.parameters()), list(model.buffers())
        shapes = [p.shape for p in params]
        sgd = trainer.optimizer([p.data.unsqueeze(0) for p in params], [client], job.lr, model)  # steps write into the model
        tracker = trainer.tracker([p.data.unsqueeze(0) for p in params], [client])
        run = trainer.run_inputs(job.global_params, job.global_buffers, shapes, templates)
        own = trainer.client_inputs([client], job.data, job.global_params, job.global_buffers, shapes, templates)
        own = type(own)(*(_first(field) for field in own))  # this client's rows
        forward = _forward(model)
        loss_sum = torch.zeros((), device=job.global_params.device)
        model.train()
        for t in range(len(plan)):
            (n, one), = plan.groups[t]
            x, y = plan.batch(t, n, one)
            logits, task_logits, extra = trainer.forward_terms(forward, params, templates, x, y, run, own)
            total, task = trainer.loss(task_logits, y, extra)
            grads = torch.autograd.grad(total, params, retain_graph=tracker is not None)
            if tracker is not None:  # the same targets the parallel engine differentiates, for a stack of one
                target = trainer.sensitivity.targets(logits.unsqueeze(0), trainer.stacked_task_losses(
                    task_logits.unsqueeze(0), y.unsqueeze(0)), None)
                tracker.update([g.unsqueeze(0) for g in torch.autograd.grad(target.sum(), params)], one)
            sgd.step([g.unsqueeze(0) for g in grads], one)
            loss_sum += task * n
        trained = get_params(model)
        (payload,), sensitivity = trainer.finish(plan, [client], trained.unsqueeze(0), get_buffers(model).unsqueeze(0),
                                                 job.global_params, sgd, tracker, job.lr)
        return trainer.mean_loss(loss_sum.unsqueeze(0), plan), payload, sensitivity


def _first(field):
    """Row 0 of a stacked input (a tensor, a list of them, or a pair of lists)."""
    if field is None:
        return None
    if isinstance(field, Tensor):
        return field[0]
    if isinstance(field, tuple):
        return tuple(_first(part) for part in field)
    return [t[0] for t in field]


def _forward(model: nn.Module):
    """How this engine runs a model (fedagg/clients/forward.py): the working model itself while it trains, the same
    structure with other weights for a frozen one."""
    pnames = [n for n, _ in model.named_parameters()]
    bnames = [n for n, _ in model.named_buffers()]

    def forward(params, buffers, x, *, represent: bool, frozen: bool) -> Representation:
        if not frozen:
            return model.represent(x) if represent else Representation(None, model(x))
        return frozen_call(model, dict(zip(pnames, params)), dict(zip(bnames, buffers)), x, represent)

    return forward
