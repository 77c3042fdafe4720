"""How many clients the parallel engine trains at once under `chunk_size: auto`.

On a GPU a chunk should be as large as memory allows (one launch serves more clients), and
what it costs follows the model: every client in a chunk holds its weights, their gradient,
momentum and the round's anchor (a few copies of P floats), and the activations of its
batch, which for a ResNet-18 at 64 px are far more than its weights. The estimate below
counts both: the floats every layer outputs for one sample (one forward in eval mode,
no gradient, changing nothing) times the batch size, and divides what the GPU has beside
the data the run keeps on it and the round's [K, P] of trained models. It uses the
device's total memory, not what happens to be free, so a resumed run picks the same chunks
(and so the same kernels) as the run it continues.

On the CPU a chunk is about calls rather than memory: every local step of a chunk is one
call, which costs a few milliseconds of Python and dispatch whatever its size, so a small
model (an MLP, a logistic regression) takes as many clients at once as `CPU_BUDGET` of their
state and activations holds (the 240 clients of 24 stacked digits runs in one chunk); a
convolutional model, whose activations fill caches, keeps `CPU_CHUNK`.
"""

from __future__ import annotations

import torch
from torch import nn

CPU_CHUNK = 64  # the fewest clients a chunk holds on the CPU
CPU_BUDGET = 256 << 20  # bytes of the clients' state and activations a CPU chunk may hold beyond CPU_CHUNK's
MAX_CHUNK = 1024  # beyond this, a chunk serves no GPU better and only delays the first step's error
GPU_SHARE = 0.8  # of the device's memory; the rest for the allocator's fragmentation and the CUDA context
STATE_COPIES = 5  # per client: weights, gradient, momentum, anchor, one round's result row
ACTIVATION_COPIES = 3  # per activation: the output, what backward saves, its gradient


def activation_floats(model: nn.Module, sample: torch.Tensor) -> int:
    """Floats every module's forward returns for one sample (`sample` without its batch axis)."""
    total = 0

    def count(module, inputs, output):
        nonlocal total
        if isinstance(output, torch.Tensor) and not list(module.children()):
            total += output.numel()

    hooks = [m.register_forward_hook(count) for m in model.modules()]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(sample.unsqueeze(0))
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    return total


def client_bytes(num_params: int, activations: int, batch_size: int) -> int:
    """What one more client in a chunk costs in memory, in bytes (float32)."""
    return 4 * (STATE_COPIES * num_params + ACTIVATION_COPIES * batch_size * activations)


def auto_chunk_size(model: nn.Module, sample: torch.Tensor, batch_size: int, num_clients: int,
                    resident_bytes: int) -> int:
    """Clients per chunk for `model` trained on batches of `batch_size` like `sample`, when `num_clients`
    train this round and the run keeps `resident_bytes` of data on the device."""
    device = sample.device
    num_params = sum(p.numel() for p in model.parameters())
    if device.type != "cuda":
        return cpu_chunk(num_params, activation_floats(model, sample), batch_size)
    total = torch.cuda.get_device_properties(device).total_memory
    return chunk_for(total, resident_bytes, num_clients, num_params, activation_floats(model, sample), batch_size)


def cpu_chunk(num_params: int, activations: int, batch_size: int) -> int:
    """Clients per chunk on the CPU: what CPU_BUDGET holds, between CPU_CHUNK and MAX_CHUNK."""
    return int(min(MAX_CHUNK, max(CPU_CHUNK, CPU_BUDGET // client_bytes(num_params, activations, batch_size))))


def chunk_for(total_bytes: int, resident_bytes: int, num_clients: int, num_params: int, activations: int,
              batch_size: int) -> int:
    """Clients per chunk on a device of `total_bytes`: its share, less the resident data and the round's
    [K, P] of trained models, divided by one client's cost; between 1 and MAX_CHUNK."""
    budget = GPU_SHARE * total_bytes - resident_bytes - 4 * num_clients * num_params
    return int(max(1, min(MAX_CHUNK, budget // client_bytes(num_params, activations, batch_size))))
