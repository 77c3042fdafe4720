"""`client.weight_decay_on: kernels` (Reddi et al. 2021's ResNet, facts C of
../shared/papers/fedopt-fedprox-settings.md: Keras l2(1e-4) kernel regularizers, in SGD terms 2e-4 * w on conv
and dense kernels only): weight decay on conv/linear weights, none on norms and biases, in both engines."""

import pytest
import torch
from torch import nn

from fedagg.clients.client import ClientData
from fedagg.clients.trainer import LocalSGD, kernel_flags
from fedagg.engines.parallel import ParallelEngine
from fedagg.engines.sequential import SequentialEngine
from fedagg.models.resnet_cifar import ResNet20


def tiny():
    # parameters in order: conv.weight, conv.bias, norm.weight, norm.bias, fc.weight, fc.bias
    model = nn.Sequential(nn.Conv2d(1, 1, 1), nn.GroupNorm(1, 1), nn.Linear(1, 2))
    with torch.no_grad():
        for p, values in zip(model.parameters(), ([2.0], [0.5], [1.5], [-1.0], [3.0, -4.0], [0.25, 0.75])):
            p.copy_(torch.tensor(values).view_as(p))
    return model


def test_kernel_flags_name_conv_and_linear_weights_only():
    assert kernel_flags(tiny()) == [True, False, False, False, True, False]
    flags = kernel_flags(ResNet20(num_classes=10, in_channels=3, image_size=8))
    names = [n for n, _ in ResNet20(num_classes=10, in_channels=3, image_size=8).named_parameters()]
    assert [n for n, f in zip(names, flags) if f] == [n for n in names if n.endswith("weight") and ("conv" in n or "fc" in n or "linear" in n)]
    assert not any(f for n, f in zip(names, flags) if "bn" in n or n.endswith("bias"))


@pytest.mark.parametrize("on, expected", [
    # one step, lr 0.1, weight decay 0.5, gradient g = 1 everywhere: p - 0.1 * (1 + 0.5 p) on decayed tensors,
    # p - 0.1 elsewhere.  kernels: conv 2 -> 2 - 0.1 * 2 = 1.8; fc (3, -4) -> (2.75, -3.9); the rest - 0.1
    ("kernels", [[1.8], [0.4], [1.4], [-1.1], [2.75, -3.9], [0.15, 0.65]]),
    # all: bias 0.5 -> 0.5 - 0.1 * 1.25 = 0.375; norm 1.5 -> 1.325, -1.0 -> -1.05; fc bias -> (0.1375, 0.6125)
    ("all", [[1.8], [0.375], [1.325], [-1.05], [2.75, -3.9], [0.1375, 0.6125]]),
])
def test_one_step_by_hand(on, expected):
    model = tiny()
    trainer = LocalSGD(lr=0.1, weight_decay=0.5, weight_decay_on=on)
    params = [p.data.unsqueeze(0) for p in model.parameters()]
    sgd = trainer.optimizer(params, [ClientData(0, torch.arange(2), torch.arange(0))], 0.1, model)
    sgd.step([torch.ones_like(p) for p in params], slice(0, 1))
    for p, want in zip(model.parameters(), expected):
        assert p.detach().flatten().tolist() == pytest.approx(want, abs=1e-7)


def test_kernels_only_leaves_norms_and_biases_alone_with_momentum():
    model = tiny()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = LocalSGD(lr=0.1, momentum=0.9, weight_decay=0.5, weight_decay_on="kernels")
    params = [p.data.unsqueeze(0) for p in model.parameters()]
    sgd = trainer.optimizer(params, [ClientData(0, torch.arange(2), torch.arange(0))], 0.1, model)
    for _ in range(3):  # zero gradients: only the decay moves anything
        sgd.step([torch.zeros_like(p) for p in params], slice(0, 1))
    # momentum SGD on g = 0.5 w alone (buf starts at g, then 0.9 buf + g), by hand for w = 2:
    # step 1: buf = 1.0, w = 1.9; step 2: buf = 0.9 + 0.95 = 1.85, w = 1.715; step 3: buf = 1.665 + 0.8575
    # = 2.5225, w = 1.46275
    assert model[0].weight.item() == pytest.approx(1.46275, abs=1e-6)
    for p, b, flag in zip(model.parameters(), before, kernel_flags(model)):
        assert flag or torch.equal(p.detach(), b)


def test_bad_choice_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^client.weight_decay_on='biases' is not allowed; choose one of all, kernels$"):
        LocalSGD(weight_decay_on="biases")


def test_both_engines_agree_and_the_choice_matters():
    from test_parallel_engine import _rel, _setup, _two_rounds
    from fedagg.models.flat import get_buffers, get_params

    model, data, clients = _setup(ResNet20, 3, 8, [7, 12], False)
    start = get_params(model), get_buffers(model)
    out = {}
    for on in ("kernels", "all"):
        kw = dict(lr=0.05, momentum=0.9, batch_size=4, local_epochs=1, weight_decay=0.05, weight_decay_on=on)
        ref = _two_rounds(SequentialEngine(), model, start, data, clients, LocalSGD(**kw), kw["lr"])
        par = _two_rounds(ParallelEngine(), model, start, data, clients, LocalSGD(**kw), kw["lr"])
        for s, p in zip(ref, par):
            for k in range(len(clients)):
                assert _rel(p.params[k], s.params[k]) < 1e-4
        out[on] = ref[-1].params
    assert not torch.allclose(out["kernels"], out["all"])
