"""torch.optim.SGD for K clients at once, on stacked [K, ...] parameters.

Each step is the per-element arithmetic of torch.optim.SGD (dampening 0): weight decay is
added to the gradient, the momentum buffer starts as the first gradient and is then
mu * buf + grad, Nesterov uses grad + mu * buf, and p -= lr * update. Each step moves only
the selected clients, so clients whose data has run out keep their weights and buffers.
Persistent state moves in and out as one flat [P] momentum vector per client (the
buffers of the parameters in order, each flattened), the same for the sequential and
parallel engines, so `LocalSGD.optimizer_states` (a `ClientStore`) serves both.
`decays` (one flag per parameter tensor) limits weight decay to some of them: the kernels of
convolutions and linear layers with `client.weight_decay_on: kernels`, as Keras's kernel
regularizers in the FedOpt authors' ResNet (norms and biases keep their gradient as it is).
"""

from __future__ import annotations

import torch
from torch import Tensor


class StackedSGD:
    def __init__(self, params: list[Tensor], *, lr: float, momentum: float, nesterov: bool, weight_decay: float,
                 saved: list[Tensor | None], decays: list[bool] | None = None) -> None:
        """`params` [K, ...] per parameter tensor; `saved[k]` client k's flat momentum [P] or None; `decays`: which
        parameter tensors weight decay applies to (None: all)."""
        self.params, self.lr, self.momentum = params, lr, momentum
        self.nesterov, self.weight_decay = nesterov, weight_decay
        if decays is not None and len(decays) != len(params):
            raise ValueError(f"StackedSGD: {len(decays)} decay flags for {len(params)} parameter tensors")
        self.decays = None if decays is None or all(decays) else list(decays)
        self.buffers: list[Tensor] | None = None
        self.has_buffer = torch.zeros(len(saved), dtype=torch.bool, device=params[0].device)
        if momentum != 0:
            self.buffers = [torch.zeros_like(p) for p in params]
            sizes = [p[0].numel() for p in params]
            for k, flat in enumerate(saved):
                if flat is not None:
                    for buf, part in zip(self.buffers, flat.to(params[0].device).split(sizes)):
                        buf[k].copy_(part.view_as(buf[k]))
                    self.has_buffer[k] = True
        self._all_have = bool(self.has_buffer.all())

    @torch.no_grad()
    def step(self, grads: list[Tensor], clients: slice | Tensor) -> None:
        """One step of the selected clients (a range: in place; an index tensor: gathered and written back)."""
        params = [p[clients] for p in self.params]
        if self.weight_decay != 0 and self.decays is None:
            grads = torch._foreach_add(grads, params, alpha=self.weight_decay)
        elif self.weight_decay != 0:
            grads = [g.add(p, alpha=self.weight_decay) if d else g for g, p, d in zip(grads, params, self.decays)]
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

    def flat_buffers(self) -> Tensor | None:
        """[K, P]: each client's momentum buffers flattened and joined in parameter order (None without momentum)."""
        if self.buffers is None:
            return None
        return torch.cat([b.reshape(b.shape[0], -1) for b in self.buffers], dim=1)
