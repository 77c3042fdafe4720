"""A model's layers made fast under `torch.func.vmap` over stacked clients.

vmap runs a model on K clients' stacked weights, but its generic rules for convolutions,
pooling and BatchNorm move the client axis back and forth between layers and compute
per-client gradients slowly. `pack(model)` returns a copy (sharing the original's tensors)
whose Conv2d, BatchNorm and pooling layers carry their own batching rule: the K clients
become K groups of one grouped convolution, K*C channels of one BatchNorm or pooling call,
with activations kept as [B, K, C, H, W] from layer to layer. Outside vmap each layer
computes exactly what the original does. On the CPU with large batches a convolution runs
once per client instead (the grouped kernel is the slower one there). Linear layers keep
vmap's own rule: one batched matmul, dispatched in C++ (a rule of our own, in Python, cost
about 2 ms a layer a call on the CPU, several times the matmul of a small model).

The parallel engine differentiates with ordinary autograd around the vmapped forward
(grad of vmap), so the backward pass runs these plain grouped kernels, not vmap rules.
BatchNorm in training mode normalises each client's channels over its own batch and
updates the stacked running statistics in place, per client and exactly as nn.BatchNorm
does (the engine calls a group of clients only with batches of the same size).
"""

from __future__ import annotations

import copy
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._C._functorch import is_batchedtensor

from fedagg.models.adapters.frozen import plain_tensors


CPU_CHANNELS_LAST = True  # grouped convolutions in channels_last on the CPU (see _conv_packed); False: as the engine says
# models with these keep the contiguous layout on the CPU: ResNet-20's BatchNorm on tiny maps and its functional average
# pool (a slow generic vmap rule on channels_last input) were not measured faster
NORMS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)
CPU_CONV_LOOP = True  # per-client convolutions on the CPU for large batches (see _conv_packed); False: the rule before
LOOP_MAX_CHANNELS, LOOP_MIN_BATCH = 4, 32  # before: per client only for input layers (few channels) on large batches


class PackContext:
    """Settings shared by a packed model's layers."""

    def __init__(self) -> None:
        self.channels_last = False
        self.cpu_channels_last = False  # grouped convolutions in channels_last on the CPU (set by `pack`)


def _front(t: Tensor | None, bdim: int | None, k: int) -> Tensor | None:
    """A per-client tensor with the client axis first (broadcast when it is not batched)."""
    if t is None:
        return None
    return t.expand(k, *t.shape) if bdim is None else t.movedim(bdim, 0)


def _packed_channels(x: Tensor, bdim: int | None, k: int) -> Tensor:
    """Activations [.., B, C, *S] with a client axis -> [B, K*C, *S] (a view when already [B, K, C, *S])."""
    x = x.unsqueeze(1).expand(x.shape[0], k, *x.shape[1:]) if bdim is None else x.movedim(bdim, 1)
    return x.reshape(x.shape[0], -1, *x.shape[3:])


def _unpacked(out: Tensor, k: int):
    """[B, K*C, *S] -> ([B, K, C, *S], client dim 1) as a vmap rule returns it."""
    return out.view(out.shape[0], k, -1, *out.shape[2:]), 1


def _op(name: str, plain, packed) -> type[torch.autograd.Function]:
    """An autograd.Function that is `plain` outside vmap and `packed(k, in_dims, *args)` under it.

    Packed layers call it only with batched input, where the vmap rule runs on plain tensors
    and autograd records those ops; `backward` is therefore never reached.
    """

    def backward(ctx, *grads):
        raise RuntimeError(f"packed {name}: backward outside vmap is not supported")

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(plain),
        "setup_context": staticmethod(lambda ctx, inputs, output: None),
        "backward": staticmethod(backward),
        "vmap": staticmethod(lambda info, in_dims, *args: packed(info.batch_size, in_dims, *args)),
    })


def stacked_channels_last(w: Tensor) -> Tensor:
    """Stacked convolution weights [K, Cout, Cin, kh, kw], the same values laid out so that their
    [K*Cout, Cin, kh, kw] view is already channels_last: `_conv_packed` then needs no copy per forward."""
    return w.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)


def _conv_packed(k, in_dims, x, w, b, stride, padding, dilation, groups, channels_last, cpu_channels_last=False):
    large = in_dims[0] is not None and x.shape[1 - in_dims[0]] >= LOOP_MIN_BATCH
    if x.device.type == "cpu" and large and (CPU_CONV_LOOP or w.shape[-3] <= LOOP_MAX_CHANNELS):
        # on the CPU, with batches of 32 and more, oneDNN's grouped kernels (K groups of a few channels) ran
        # 1.3-2x slower than one ordinary convolution per client, forward and backward (LeNet's 12-channel layers:
        # what made engine=parallel slower than sequential on cross_silo); on small batches (cross_device's 10)
        # the grouped kernel wins, its one call against K; on a GPU the grouped kernel is one launch, not K
        # unbind, not indexing: the backward of K indexings writes each client's gradient into a zero tensor of
        # the whole stack (K^2 work), unbind's stacks them once
        xs, ws = _front(x, in_dims[0], k).unbind(0), _front(w, in_dims[1], k).unbind(0)
        bs = None if b is None else _front(b, in_dims[2], k).unbind(0)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        outs = [F.conv2d(xs[i].contiguous(memory_format=fmt), ws[i], None if bs is None else bs[i], stride, padding,
                         dilation, groups) for i in range(k)]
        return torch.stack(outs, 1), 1
    xp = _packed_channels(x, in_dims[0], k)
    w = _front(w, in_dims[1], k).reshape(-1, *w.shape[-3:])
    b = None if b is None else _front(b, in_dims[2], k).reshape(-1)
    if channels_last or (cpu_channels_last and CPU_CHANNELS_LAST and xp.device.type == "cpu"):
        # the weights are a view, not a copy, when the engine stacked them with stacked_channels_last. On the CPU
        # without normalisation layers (NORMS) always: oneDNN's grouped kernels ran 1.2x faster on channels_last
        # forward and backward, 1.35-1.4x forward alone (cnn_small's two layers, K=100 clients, batches of 10; CPU
        # time), and the max-pool after them reads that layout without the two copies of the activations (forward,
        # and the gradient back) it otherwise pays
        xp, w = xp.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
    return _unpacked(F.conv2d(xp, w, b, stride, padding, dilation, groups * k), k)


_Conv2d = _op("PackedConv2d", lambda x, w, b, s, p, d, g, cl, cpu_cl: F.conv2d(x, w, b, s, p, d, g), _conv_packed)




def _pool_packed(k, in_dims, x, fn, kwargs):
    xp = _packed_channels(x, in_dims[0], k)
    if fn is F.max_pool2d and xp.device.type == "cpu":
        # the CPU kernel is many times faster on channels_last, and a max is exact in any layout
        xp = xp.contiguous(memory_format=torch.channels_last)
    return _unpacked(fn(xp, **kwargs), k)


_Pool = _op("PackedPool", lambda x, fn, kwargs: fn(x, **kwargs), _pool_packed)


def _bn_plain(x, weight, bias, rm, rv, nbt, use_batch_stats, momentum, eps):
    raise RuntimeError("packed BatchNorm runs only under vmap")


def _bn_packed(k, in_dims, x, weight, bias, rm, rv, nbt, use_batch_stats, momentum, eps):
    xp = _packed_channels(x, in_dims[0], k)
    weight, bias, rm, rv, nbt = (None if t is None else _front(t, d, k)
                                 for t, d in zip((weight, bias, rm, rv, nbt), in_dims[1:6]))
    flat = lambda t: None if t is None else t.reshape(-1)  # noqa: E731
    if not use_batch_stats:
        return _unpacked(F.batch_norm(xp, flat(rm), flat(rv), flat(weight), flat(bias), False, 0.0, eps), k)
    factor = momentum
    if nbt is not None:
        with torch.no_grad():
            nbt.add_(1)  # every client in the call takes one step, so they all share the count
        if momentum is None:
            factor = 1.0 / float(nbt.reshape(-1)[0])
    # fused kernel; the running statistics [K, C] are updated in place through their flat views
    return _unpacked(F.batch_norm(xp, flat(rm), flat(rv), flat(weight), flat(bias), True, factor or 0.0, eps), k)


_BatchNorm = _op("PackedBatchNorm", _bn_plain, _bn_packed)


class _PackedConv2d(nn.Conv2d):
    def forward(self, x):
        if not is_batchedtensor(x):
            return super().forward(x)
        return _Conv2d.apply(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups,
                             self._pack_ctx.channels_last, self._pack_ctx.cpu_channels_last)


class _PackedBatchNorm(nn.modules.batchnorm._BatchNorm):
    def forward(self, x):
        if not is_batchedtensor(x):
            return super().forward(x)
        self._check_input_dim(x)
        use_batch_stats = self.training or self.running_mean is None
        return _BatchNorm.apply(x, self.weight, self.bias, self.running_mean, self.running_var,
                                self.num_batches_tracked if self.training else None, use_batch_stats,
                                self.momentum, self.eps)


def _pool_module(base: type[nn.Module], fn, keys: tuple[str, ...]) -> type[nn.Module]:
    def forward(self, x):
        if not is_batchedtensor(x):
            return base.forward(self, x)
        return _Pool.apply(x, fn, {key: getattr(self, key) for key in keys})

    return type(f"_Packed{base.__name__}", (base,), {"forward": forward})


_SWAPS: dict[type, type] = {
    nn.Conv2d: _PackedConv2d,
    nn.BatchNorm1d: type("_PackedBatchNorm1d", (_PackedBatchNorm, nn.BatchNorm1d), {}),
    nn.BatchNorm2d: type("_PackedBatchNorm2d", (_PackedBatchNorm, nn.BatchNorm2d), {}),
    nn.MaxPool2d: _pool_module(nn.MaxPool2d, F.max_pool2d,
                               ("kernel_size", "stride", "padding", "dilation", "ceil_mode")),
    nn.AvgPool2d: _pool_module(nn.AvgPool2d, F.avg_pool2d,
                               ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")),
    nn.AdaptiveAvgPool2d: _pool_module(nn.AdaptiveAvgPool2d, F.adaptive_avg_pool2d, ("output_size",)),
}


def _packable(module: nn.Module) -> bool:
    if type(module) is nn.Conv2d:
        return module.padding_mode == "zeros"
    if type(module) is nn.MaxPool2d:
        return not module.return_indices
    return type(module) in _SWAPS


def pack(model: nn.Module) -> tuple[nn.Module, PackContext]:
    """A copy of `model` sharing its parameters and buffers, with packed layers; and their context."""
    # the frozen base under adapters (plain tensors of the modules) is shared too: held once, and a rule that changes
    # it in place (FLoRA's merge) changes what the packed copy computes with
    memo = {id(t): t for t in (*model.parameters(), *model.buffers(), *plain_tensors(model))}
    packed = copy.deepcopy(model, memo)
    ctx = PackContext()
    ctx.cpu_channels_last = not any(isinstance(m, NORMS) for m in model.modules())
    for module in packed.modules():
        if _packable(module):
            module.__class__ = _SWAPS[type(module)]
            module._pack_ctx = ctx
    return packed, ctx
