"""torch.optim.SGD for K clients at once, on stacked [K, ...] parameters.

Each step is the per-element arithmetic of torch.optim.SGD (dampening 0): weight decay is
added to the gradient, the momentum buffer starts as the first gradient and is then
mu * buf + grad, Nesterov uses grad + mu * buf, and p -= lr * update. Each step moves only
the selected clients, so clients whose data has run out keep their weights and buffers. Persistent state moves in and out in torch.optim.SGD's `state_dict` format,
so `LocalSGD.optimizer_states` is shared by the sequential and parallel engines.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn


class StackedSGD:
    def __init__(self, params: list[Tensor], *, lr: float, momentum: float, nesterov: bool, weight_decay: float,
                 saved: list[dict | None]) -> None:
        """`params` [K, ...] per parameter tensor; `saved[k]` client k's SGD state_dict or None."""
        self.params, self.lr, self.momentum = params, lr, momentum
        self.nesterov, self.weight_decay = nesterov, weight_decay
        self.buffers: list[Tensor] | None = None
        self.has_buffer = torch.zeros(len(saved), dtype=torch.bool, device=params[0].device)
        if momentum != 0:
            self.buffers = [torch.zeros_like(p) for p in params]
            for k, state in enumerate(saved):
                entries = (state or {}).get("state", {})
                if entries and all("momentum_buffer" in entries.get(i, {}) for i in range(len(params))):
                    for i, buf in enumerate(self.buffers):
                        buf[k].copy_(entries[i]["momentum_buffer"])
                    self.has_buffer[k] = True
        self._all_have = bool(self.has_buffer.all())

    @torch.no_grad()
    def step(self, grads: list[Tensor], clients: slice | Tensor) -> None:
        """One step of the selected clients (a range: in place; an index tensor: gathered and written back)."""
        params = [p[clients] for p in self.params]
        if self.weight_decay != 0:
            grads = torch._foreach_add(grads, params, alpha=self.weight_decay)
        update = grads
        if self.momentum != 0:
            bufs = [b[clients] for b in self.buffers]
            if self._all_have:
                torch._foreach_mul_(bufs, self.momentum)
                torch._foreach_add_(bufs, grads)
            else:  # a client's first step starts its buffer at the gradient; a saved one is continued
                has = self.has_buffer[clients]
                for b, g in zip(bufs, grads):
                    b.copy_(torch.where(has.view(-1, *[1] * (g.dim() - 1)), b.mul(self.momentum).add_(g), g))
                self.has_buffer[clients] = True
                self._all_have = bool(self.has_buffer.all())
            update = torch._foreach_add(grads, bufs, alpha=self.momentum) if self.nesterov else bufs
            if not isinstance(clients, slice):
                for b, new in zip(self.buffers, bufs):
                    b[clients] = new
        torch._foreach_add_(params, update, alpha=-self.lr)
        if not isinstance(clients, slice):
            for p, new in zip(self.params, params):
                p[clients] = new

    def state_dicts(self, template: nn.Module) -> list[dict]:
        """Each client's state in the format `torch.optim.SGD(template.parameters(), ...).state_dict()` has."""
        opt = torch.optim.SGD(template.parameters(), lr=self.lr, momentum=self.momentum, nesterov=self.nesterov,
                              weight_decay=self.weight_decay)
        groups = opt.state_dict()["param_groups"]
        out = []
        for k in range(self.params[0].shape[0]):
            state = {} if self.buffers is None else {
                # kept on the host: every client ever seen keeps one, and a GPU holds only this round's
                i: {"momentum_buffer": b[k].to("cpu", copy=True)} for i, b in enumerate(self.buffers)}
            out.append({"state": state, "param_groups": copy.deepcopy(groups)})
        return out
