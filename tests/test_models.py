"""Every conf/model/*.yaml builds through Hydra, eats a batch of its own `input_shape` and
returns [B, num_classes]; hand-computed parameter counts pin the paper architectures."""
from pathlib import Path

import hydra
import pytest
import torch
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[1] / "conf" / "model"
MNIST = dict(num_classes=10, in_channels=1, image_size=28)
CIFAR10 = dict(num_classes=10, in_channels=3, image_size=32)
CIFAR100 = dict(num_classes=100, in_channels=3, image_size=32)
DIGITS = dict(num_classes=10, in_channels=1, image_size=8)

# (yaml stem, dataset, option overrides, expected input_shape)
CASES = [
    ("mlr", MNIST, {}, (1, 28, 28)),
    ("mlr", DIGITS, {}, (1, 8, 8)),
    ("mlp", MNIST, {}, (1, 28, 28)),
    ("mlp", CIFAR100, {"hidden": 16}, (3, 32, 32)),
    ("lenet", MNIST, {}, (3, 32, 32)),  # fixed input: the pipeline resizes/repeats MNIST
    ("lenet", CIFAR100, {}, (3, 32, 32)),
    ("cnn", CIFAR10, {}, (3, 32, 32)),
    ("cnn", MNIST, {}, (1, 28, 28)),
    ("cnn_mnist", MNIST, {}, (1, 28, 28)),
    ("cnn_mnist", DIGITS, {}, (1, 8, 8)),
    ("cnn_fednnnn_mnist", MNIST, {}, (1, 28, 28)),
    ("cnn_fednnnn_mnist", CIFAR10, {}, (3, 32, 32)),
    ("cnn_fednnnn_cifar", CIFAR10, {}, (3, 32, 32)),
    ("cnn_fednnnn_cifar", DIGITS, {}, (1, 8, 8)),
    ("cnn_small", MNIST, {}, (1, 28, 28)),
    ("cnn_small", CIFAR100, {}, (3, 32, 32)),
    ("resnet20", CIFAR10, {}, (3, 32, 32)),
    ("resnet20", CIFAR100, {"shortcut": "B"}, (3, 32, 32)),
    ("resnet20", DIGITS, {}, (1, 8, 8)),
    ("resnet32", CIFAR100, {}, (3, 32, 32)),
    ("resnet18", CIFAR10, {}, (3, 224, 224)),
    ("resnet18", MNIST, {}, (3, 224, 224)),  # grey is repeated by the pipeline, not here
    ("resnet18", MNIST, {"stem": "cifar"}, (1, 28, 28)),
    ("resnet18", DIGITS, {"input_size": None}, (3, 8, 8)),  # stock stem, no upsampling
    ("resnet34", CIFAR100, {}, (3, 224, 224)),
    ("resnet34", CIFAR10, {"stem": "cifar"}, (3, 32, 32)),
    ("cnn_femnist", dict(num_classes=62, in_channels=1, image_size=28), {}, (1, 28, 28)),
    ("cnn_femnist", CIFAR10, {}, (3, 32, 32)),
    ("cnn_emnist_tff", dict(num_classes=62, in_channels=1, image_size=28), {}, (1, 28, 28)),
    ("cnn_emnist_tff", CIFAR10, {"dropout_conv": 0.0}, (3, 32, 32)),
    ("resnet18_gn", CIFAR100, {}, (3, 32, 32)),
    ("resnet18_gn", CIFAR100, {"block": "preact", "stem": "imagenet"}, (3, 32, 32)),
    ("cnn_bn", MNIST, {}, (1, 28, 28)),
    ("cnn_bn", DIGITS, {}, (1, 8, 8)),
    ("vit_tiny", MNIST, {}, (1, 28, 28)),
    ("vit_tiny", CIFAR10, {}, (3, 32, 32)),
    ("vit_tiny", DIGITS, {"input_size": 28}, (1, 28, 28)),
]
# token ids in, logits per position out (tests/test_natural.py, tests/test_transformers.py); text_decoder: ids
# in, classes out, and hf: a checkpoint's (tests/test_hf.py)
SEQUENCE_MODELS = {"lstm_shakespeare", "char_decoder", "text_decoder", "hf"}


def build(name, dataset, **overrides):
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    cfg = OmegaConf.merge(cfg, overrides)
    return hydra.utils.instantiate(cfg)(**dataset)


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def test_every_yaml_is_covered():
    assert {p.stem for p in CONF.glob("*.yaml")} == {c[0] for c in CASES} | SEQUENCE_MODELS


@pytest.mark.parametrize("name,dataset,overrides,shape", CASES,
                         ids=[f"{c[0]}-{c[3]}-{c[2]}" for c in CASES])
def test_forward_shape(name, dataset, overrides, shape):
    model = build(name, dataset, **overrides).eval()
    assert model.input_shape == shape
    with torch.no_grad():
        out = model(torch.randn(2, *model.input_shape))
    assert out.shape == (2, dataset["num_classes"])
    assert torch.isfinite(out).all()


def test_cnn_mnist_matches_fedadp_count():
    assert n_params(build("cnn_mnist", MNIST)) == 1_663_370


def test_lenet_count_cifar10():
    # conv 3->12 k5: 3*12*25+12 = 912; conv 12->12 k5 (x2): 12*12*25+12 = 3,612 each;
    # linear 12*8*8 = 768 -> 10: 7,690.  912 + 2*3,612 + 7,690 = 15,826
    assert n_params(build("lenet", CIFAR10)) == 15_826


def test_cnn_bn_count():
    # conv 1->16 k5: 16*25+16 = 416, BN 32; conv 16->32 k5: 32*16*25+32 = 12,832, BN 64;
    # fc 32*7*7 = 1,568 -> 64: 100,416; fc 64 -> 10: 650.  Total 114,410
    model = build("cnn_bn", MNIST)
    assert n_params(model) == 114_410
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()) == 2


def test_fednnnn_mnist_count():
    # conv 1->20 k5: 520; conv 20->50 k5: 25,050; fc 800->500: 400,500; fc 500->10: 5,010
    assert n_params(build("cnn_fednnnn_mnist", MNIST)) == 431_080


def test_resnet20_counts():
    # stem: conv 3*16*9 = 432 + BN 32
    # stage 1: 3 blocks x 2 x (16*16*9 + BN 32) = 14,016
    # stage 2: (16*32*9 + 64) + (32*32*9 + 64) + 2 blocks x 2 x (9,216 + 64) = 51,072
    # stage 3: (32*64*9 + 128) + (64*64*9 + 128) + 2 blocks x 2 x (36,864 + 128) = 203,520
    # fc 64*10 + 10 = 650.  Total 269,722 (the "0.27M" of He et al.)
    a = n_params(build("resnet20", CIFAR10))
    assert a == 269_722
    # option B adds two 1x1 conv + BN projections: (16*32 + 64) + (32*64 + 128) = 2,752
    assert n_params(build("resnet20", CIFAR10, shortcut="B")) == a + 2_752


def test_resnet32_deeper_than_resnet20():
    # two more blocks per stage: 2*(4,672) + 2*(18,560) + 2*(73,984) = 194,432
    assert n_params(build("resnet32", CIFAR10)) == 269_722 + 194_432


@pytest.mark.parametrize("name,minimum", [("cnn", 18), ("cnn_fednnnn_mnist", 16), ("cnn_small", 16)])
def test_too_small_input_names_model_and_minimum(name, minimum):
    with pytest.raises(ValueError, match=rf"{name}\b.*\(1, 8, 8\).*{minimum}x{minimum}"):
        build(name, DIGITS)


def test_build_leaves_batchnorm_stats_untouched():
    # measuring the flatten size must not shift running stats away from their init
    model = build("cnn_fednnnn_cifar", CIFAR10)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and model.training
    for bn in bns:
        assert torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean))
        assert torch.equal(bn.running_var, torch.ones_like(bn.running_var))
        assert bn.num_batches_tracked.item() == 0


@pytest.mark.parametrize("name,bad", [("resnet20", {"shortcut": "C"}), ("resnet18", {"stem": "vit"})])
def test_bad_option_raises(name, bad):
    with pytest.raises(ValueError):
        build(name, CIFAR10, **bad)


REPRESENTED = [c for c in CASES if c[2] == {}] + [("lstm_shakespeare", dict(num_classes=12, in_channels=1, image_size=7),
                                                    {"hidden": 16}, (7,)),
                                                   ("char_decoder", dict(num_classes=12, in_channels=1, image_size=7),
                                                    {"dim": 16, "depth": 1}, (7,))]


@pytest.mark.parametrize("name,dataset,overrides,shape", REPRESENTED,
                         ids=[f"{c[0]}-{c[3]}" for c in REPRESENTED])
def test_every_backbone_represents_a_batch_as_the_input_of_its_last_linear_layer(name, dataset, overrides, shape):
    """`represent(x)`: the features the last linear layer receives (caught with a hook on that layer) and the
    logits forward gives, from one pass."""
    from fedagg.models.base import Backbone, Representation

    model = build(name, dataset, **overrides).eval()
    assert isinstance(model, Backbone)
    seen = []
    hook = model.last_layer.register_forward_hook(lambda m, inputs, out: seen.append(inputs[0]))
    x = (torch.randint(0, dataset["num_classes"], (3, *shape)) if name in SEQUENCE_MODELS
         else torch.randn(3, *model.input_shape))
    with torch.no_grad():
        out = model.represent(x)
        logits = model(x)
    hook.remove()
    lead = (3, *shape) if name in SEQUENCE_MODELS else (3,)
    assert isinstance(out, Representation)
    assert out.features.shape == (*lead, model.representation_dim)
    assert torch.equal(out.features, seen[0]) and torch.equal(out.logits, logits)
    assert out.logits.shape == (*lead, dataset["num_classes"])


def test_a_projection_head_goes_under_a_new_last_layer():
    """MOON's ModelFedCon: h -> d -> ReLU -> dim = z, logits = Linear(dim, C)(z); z is the representation."""
    model = build("mlp", DIGITS)
    before = n_params(model)
    torch.manual_seed(0)
    model.add_projection_head(5)
    # MLP: h has 64 features; head 64*64+64 + 64*5+5; the last layer 64*10+10 becomes 5*10+10
    assert n_params(model) == before + (64 * 64 + 64) + (64 * 5 + 5) - (64 * 10 + 10) + (5 * 10 + 10)
    x = torch.randn(4, 1, 8, 8)
    out = model.represent(x)
    h = model.net[2](model.net[1](model.net[0](x)))
    p = model.projection
    z = p[2](torch.relu(p[0](h)))
    assert model.representation_dim == 5 and torch.allclose(out.features, z)
    assert torch.allclose(out.logits, model.net[3](z)) and torch.allclose(model(x), out.logits)
