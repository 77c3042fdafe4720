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
