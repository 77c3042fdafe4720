"""resnet18_gn: torchvision's ResNet-18 with GroupNorm(2, C) in place of every BatchNorm."""

import pytest
import torch
from torch import nn

from fedagg.engines.parallel import ParallelEngine
from fedagg.engines.sequential import SequentialEngine
from fedagg.models.resnet_gn import ResNet18GN


def test_every_norm_is_a_two_group_group_norm_and_nothing_is_a_buffer():
    model = ResNet18GN(num_classes=100, in_channels=3, image_size=32)  # conf/model/resnet18_gn.yaml's defaults
    norms = [m for m in model.modules() if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm))]
    assert len(norms) == 20 and all(isinstance(m, nn.GroupNorm) and m.num_groups == 2 for m in norms)
    assert [m.num_channels for m in norms][:3] == [64, 64, 64] and norms[-1].num_channels == 512
    assert list(model.buffers()) == []  # no running statistics to average across clients
    # torchvision's ResNet-18 has 11,227,812 parameters with a 100-way head and its 7x7 stem; the 3x3 CIFAR
    # stem has 3*64*(9-49) fewer = 11,220,132; GroupNorm has BatchNorm's affine parameters, so no change there
    assert sum(p.numel() for p in model.parameters()) == 11_220_132
    assert model.input_shape == (3, 32, 32) and model(torch.zeros(2, 3, 32, 32)).shape == (2, 100)
    with pytest.raises(ValueError) as err:
        ResNet18GN(num_classes=10, in_channels=3, image_size=32, groups=3)
    assert str(err.value) == "model.groups=3 is not allowed; it must divide 64 (the narrowest layer), e.g. 2"


@pytest.mark.slow  # an 11M-parameter model trained twice on the CPU
def test_resnet18_gn_trains_alike_in_both_engines():
    from test_parallel_engine import _rel, _setup, _two_rounds
    from fedagg.clients.trainer import LocalSGD
    from fedagg.models.flat import get_buffers, get_params

    model, data, clients = _setup(ResNet18GN, 3, 8, [6, 9], True)
    start = get_params(model), get_buffers(model)
    kw = dict(lr=0.02, momentum=0.9, batch_size=4, local_epochs=1)
    ref = _two_rounds(SequentialEngine(), model, start, data, clients, LocalSGD(**kw), kw["lr"])
    par = _two_rounds(ParallelEngine(), model, start, data, clients, LocalSGD(**kw), kw["lr"])
    for s, p in zip(ref, par):
        for k in range(len(clients)):
            assert _rel(p.params[k], s.params[k]) < 1e-4
        torch.testing.assert_close(p.train_loss, s.train_loss, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("block", ["basic", "preact"])
def test_norm_eps_reaches_every_group_norm(block):
    """PyTorch's 1e-5 by default; the FedOpt authors' tfa layer uses 1e-3 (tensorflow/addons@0584b2a)."""
    for eps in (1e-5, 1e-3):
        kwargs = {} if eps == 1e-5 else {"norm_eps": eps}
        model = ResNet18GN(num_classes=10, in_channels=3, image_size=32, block=block, **kwargs)
        norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
        assert norms and {m.eps for m in norms} == {eps}
    with pytest.raises(ValueError, match=r"^model.norm_eps=0 is not allowed; it must be a number in \(0, 1\)"):
        ResNet18GN(num_classes=10, in_channels=3, image_size=32, block=block, norm_eps=0)
