"""The backbones of the FedOpt table (Reddi et al. 2021; facts C, E of
../shared/papers/fedopt-fedprox-settings.md): TFF's EMNIST conv-dropout CNN and the ResNet-18 GN options,
with their parameter counts by hand."""

import pytest
import torch
from torch import nn

from fedagg.engines.parallel import ParallelEngine
from fedagg.engines.sequential import SequentialEngine
from fedagg.models.tff import CNNEmnistTFF

EMNIST = dict(num_classes=62, in_channels=1, image_size=28)


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def test_cnn_emnist_tff_layers_and_count():
    model = CNNEmnistTFF(**EMNIST)
    # conv 1->32 k3: 9*32 + 32 = 320; conv 32->64 k3: 9*32*64 + 64 = 18,496; 28 -> 26 -> 24 -> pool 12:
    # 12*12*64 = 9,216 -> 128: 1,179,776; 128 -> 62: 7,998.  Total 1,206,590
    assert n_params(model) == 1_206_590
    kinds = [type(m).__name__ for m in [*model.features, *model.classifier]]
    assert kinds == ["Conv2d", "ReLU", "Conv2d", "ReLU", "MaxPool2d", "Dropout", "Linear", "ReLU", "Dropout", "Linear"]
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.25, 0.5]
    assert model.representation_dim == 128 and model.last_layer.out_features == 62
    assert all(torch.equal(m.bias, torch.zeros_like(m.bias)) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))


def test_cnn_emnist_tff_glorot_normal_init():
    torch.manual_seed(0)
    w = CNNEmnistTFF(**EMNIST).classifier[0].weight  # fan_in 9,216, fan_out 128
    std = (2 / (9216 + 128)) ** 0.5
    assert w.std().item() == pytest.approx(std, rel=0.01)  # the truncation's rescaling keeps the std
    assert w.abs().max().item() <= 2 * std / 0.87962566103423978 + 1e-9


def test_cnn_emnist_tff_dropout_only_in_training():
    torch.manual_seed(0)
    model = CNNEmnistTFF(**EMNIST)
    x = torch.randn(4, 1, 28, 28)
    model.eval()
    assert torch.equal(model(x), model(x))
    model.train()
    assert not torch.equal(model(x), model(x))
    no_drop = CNNEmnistTFF(**EMNIST, dropout_conv=0.0, dropout_dense=0.0).train()
    assert torch.equal(no_drop(x), no_drop(x))


@pytest.mark.parametrize("key, value", [("dropout_conv", 1.0), ("dropout_dense", -0.1)])
def test_cnn_emnist_tff_bad_dropout(key, value):
    with pytest.raises(ValueError) as err:
        CNNEmnistTFF(**EMNIST, **{key: value})
    assert str(err.value) == f"model.{key}={value!r} is not allowed; it must be in [0, 1) (0: no dropout)"


def test_cnn_emnist_tff_trains_alike_in_both_engines_without_dropout_and_runs_with_it():
    from test_parallel_engine import _rel, _setup, _two_rounds
    from fedagg.clients.trainer import LocalSGD
    from fedagg.models.flat import get_buffers, get_params

    def no_dropout(**kw):
        return CNNEmnistTFF(**kw, dropout_conv=0.0, dropout_dense=0.0)

    kw = dict(lr=0.05, momentum=0.0, batch_size=4, local_epochs=1)
    model, data, clients = _setup(no_dropout, 1, 28, [6, 9], False)
    start = get_params(model), get_buffers(model)
    ref = _two_rounds(SequentialEngine(), model, start, data, clients, LocalSGD(**kw), kw["lr"])
    par = _two_rounds(ParallelEngine(), model, start, data, clients, LocalSGD(**kw), kw["lr"])
    for s, p in zip(ref, par):
        for k in range(len(clients)):
            assert _rel(p.params[k], s.params[k]) < 1e-4
    # with dropout the parallel engine draws each client's masks itself: it trains, and differently from no dropout
    model, data, clients = _setup(CNNEmnistTFF, 1, 28, [6, 9], False)
    start = get_params(model), get_buffers(model)
    par_drop = _two_rounds(ParallelEngine(), model, start, data, clients, LocalSGD(**kw), kw["lr"])
    seq_drop = _two_rounds(SequentialEngine(), model, start, data, clients, LocalSGD(**kw), kw["lr"])
    for p, s in zip(par_drop, seq_drop):
        assert torch.isfinite(p.params).all() and not torch.equal(p.params[0], p.params[1])
        assert _rel(p.params, s.params) < 0.5  # the same training, other masks: close, not equal


def test_resnet18_gn_preact_is_the_authors_v2_network_and_counts_by_hand():
    from fedagg.models.resnet_gn import ResNet18GN

    model = ResNet18GN(num_classes=100, in_channels=3, image_size=24, stem="imagenet", block="preact")
    # convs: stem 7*7*3*64 = 9,408; stage 1: 4 x 9*64*64 = 147,456; stage 2: 9*64*128 + 3 x 9*128*128 +
    # 1x1 64*128 = 524,288; stage 3: 9*128*256 + 3 x 9*256*256 + 128*256 = 2,097,152; stage 4:
    # 9*256*512 + 3 x 9*512*512 + 256*512 = 8,388,608; sum 11,166,912.
    # norms (weight + bias = 2 per channel): stem 64; stage 1: 3 pre-norms of 64 (the first block has none);
    # stage 2: 64 + 4 x 128 with the shortcut's; stage 3: 128 + 4 x 256; stage 4: 256 + 4 x 512; final 512:
    # 2 * (64 + 192 + 576 + 1,152 + 2,304 + 512) = 9,600.  dense 512*100 + 100 = 51,300.  Total 11,227,812
    assert n_params(model) == 11_227_812
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert len(norms) == 1 + 3 + 5 + 5 + 5 + 1 and all(m.num_groups == 2 for m in norms)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules()) and list(model.buffers()) == []
    assert model.input_shape == (3, 24, 24)
    maps = []
    hooks = [b.register_forward_hook(lambda m, i, o: maps.append(tuple(o.shape[1:]))) for b in model.net.blocks]
    out = model(torch.zeros(2, 3, 24, 24))
    for h in hooks:
        h.remove()
    assert out.shape == (2, 100)
    # 24 -> conv/2 12 -> pool/2 6, and every stage stays at 6x6 (the authors' create_resnet passes no strides)
    assert maps == [(64, 6, 6)] * 2 + [(128, 6, 6)] * 2 + [(256, 6, 6)] * 2 + [(512, 6, 6)] * 2
    assert model.representation_dim == 512 and model.last_layer is model.net.fc


def test_resnet18_gn_imagenet_stem_and_the_default_unchanged():
    from fedagg.models.resnet_gn import ResNet18GN

    torch.manual_seed(0)
    basic = ResNet18GN(num_classes=100, in_channels=3, image_size=32)
    assert n_params(basic) == 11_220_132 and basic.block == "basic"  # as before the option existed
    # torchvision's own stem (7x7/2 + max-pool) with GroupNorm: 11,227,812 (its 100-way count)
    stock = ResNet18GN(num_classes=100, in_channels=3, image_size=24, stem="imagenet")
    assert n_params(stock) == 11_227_812 and stock.net.conv1.kernel_size == (7, 7) and stock.input_shape == (3, 24, 24)
    with pytest.raises(ValueError, match=r"^model.block='v3' is not allowed; choose one of basic, preact"):
        ResNet18GN(num_classes=10, in_channels=3, image_size=32, block="v3")
