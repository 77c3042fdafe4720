"""Small CNNs from the papers. Each builds `features` (conv part) and `classifier` (linear
part); the width of the first linear layer is measured from `input_shape`, so one class
serves 28x28 MNIST, 32x32 CIFAR and, where the layers allow, 8x8 digits."""
import torch
from torch import Tensor, nn

from fedagg.models.base import Backbone, run_through


def _flat_size(name: str, features: nn.Module, input_shape: tuple[int, int, int]) -> int:
    """Number of features after `features` on one image of `input_shape`.

    Raises ValueError naming the smallest square input the layers accept, so a bad
    model/dataset pairing fails at build time rather than deep inside a round."""

    def probe(shape) -> int:
        # eval() so BatchNorm neither updates its running stats nor needs a batch of 2.
        was_training = features.training
        features.eval()
        try:
            with torch.no_grad():
                return features(torch.zeros(1, *shape)).numel()
        except RuntimeError:  # a kernel or pool larger than what is left of the image
            return 0
        finally:
            features.train(was_training)

    size = probe(input_shape)
    if size > 0:
        return size
    c, h, _ = input_shape
    smallest = next((s for s in range(h + 1, 1025) if probe((c, s, s)) > 0), None)
    raise ValueError(
        f"{name} cannot take inputs of shape {tuple(input_shape)}: it needs images of at "
        f"least {smallest}x{smallest}"
    )


class _ConvNet(Backbone):
    """Shared forward; subclasses set `input_shape`, `features` and `classifier` (a linear layer, or a
    Sequential ending in one): the representation is the input of that last linear layer."""

    @property
    def classifier_name(self) -> str:
        return f"classifier.{len(self.classifier) - 1}" if isinstance(self.classifier, nn.Sequential) else "classifier"

    def encode(self, x: Tensor) -> Tensor:
        h = self.features(x).flatten(1)
        return run_through(self.classifier, h, -1) if isinstance(self.classifier, nn.Sequential) else h

    def classify(self, h: Tensor) -> Tensor:
        return self.classifier[-1](h) if isinstance(self.classifier, nn.Sequential) else self.classifier(h)


class LeNet(_ConvNet):
    """EWWA-FL's paper (Hu et al. 2023) Sec. IV: three stride-2/2/1 convs with sigmoids, 768 -> C.

    The input is fixed at 3x32x32 whatever the dataset; MNIST is resized and repeated to
    three channels by the data pipeline."""

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int):
        super().__init__()
        self.input_shape = (3, 32, 32)
        self.features = nn.Sequential(
            nn.Conv2d(3, 12, 5, stride=2, padding=2), nn.Sigmoid(),
            nn.Conv2d(12, 12, 5, stride=2, padding=2), nn.Sigmoid(),
            nn.Conv2d(12, 12, 5, stride=1, padding=2), nn.Sigmoid(),
        )
        self.classifier = nn.Linear(_flat_size("lenet", self.features, self.input_shape), num_classes)


class CNN(_ConvNet):
    """FedAWA's paper (Shi et al. 2025) App. A.6 "CNN": 3x3 convs 32, 64, 64 (no padding), max-pool after the first two."""

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int):
        super().__init__()
        self.input_shape = (in_channels, image_size, image_size)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3), nn.ReLU(),
        )
        # 64*4*4 on 32x32 as in the paper; 64*3*3 on 28x28.
        flat = _flat_size("cnn", self.features, self.input_shape)
        self.classifier = nn.Sequential(nn.Linear(flat, 64), nn.ReLU(), nn.Linear(64, num_classes))


class CNNMnist(_ConvNet):
    """FedAdp's paper (Wu & Wang 2021) footnote 4 (McMahan et al.'s 2NN-CNN): 5x5 convs 32, 64, fc 512.

    Padding 2 ("same") is what gives the paper's 1,663,370 parameters on 28x28 (7*7*64 =
    3136 inputs to the fc); the footnote's "1024x512" would be the unpadded variant."""

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int, hidden: int = 512,
                 name: str = "cnn_mnist"):
        super().__init__()
        self.input_shape = (in_channels, image_size, image_size)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        )
        flat = _flat_size(name, self.features, self.input_shape)
        self.classifier = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


class CNNFedNNNNMnist(_ConvNet):
    """FedNNNN's paper (Nagura et al. 2020) Table 3: 5x5 convs 20, 50 (no padding), each ReLU + max-pool; fc 500."""

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int):
        super().__init__()
        self.input_shape = (in_channels, image_size, image_size)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 20, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(20, 50, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        flat = _flat_size("cnn_fednnnn_mnist", self.features, self.input_shape)  # 50*4*4 on 28x28
        self.classifier = nn.Sequential(nn.Linear(flat, 500), nn.ReLU(), nn.Linear(500, num_classes))


def _conv_bn_relu(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]


class CNNFedNNNNCifar(_ConvNet):
    """FedNNNN's paper (Nagura et al. 2020) Table 4: three VGG-style stages of two 3x3 conv+BN+ReLU (32, 64, 128),
    each followed by max-pool; fc 382, 192 (382 as printed in the table)."""

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int):
        super().__init__()
        self.input_shape = (in_channels, image_size, image_size)
        layers: list[nn.Module] = []
        for cin, cout in [(in_channels, 32), (32, 64), (64, 128)]:
            layers += _conv_bn_relu(cin, cout) + _conv_bn_relu(cout, cout) + [nn.MaxPool2d(2)]
        self.features = nn.Sequential(*layers)
        flat = _flat_size("cnn_fednnnn_cifar", self.features, self.input_shape)  # 128*4*4 on 32x32
        self.classifier = nn.Sequential(
            nn.Linear(flat, 382), nn.ReLU(),
            nn.Linear(382, 192), nn.ReLU(),
            nn.Linear(192, num_classes),
        )


class CNNSmall(_ConvNet):
    """aggregation-comparison…txt Sec. 3 "Models": 5x5 convs with 10 and 20 kernels, then two
    linear layers. The paper gives no pooling or hidden width; we use the common PyTorch
    MNIST layout (max-pool + ReLU after each conv, 320 -> 50 -> C on 28x28), minus dropout."""

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int, hidden: int = 50):
        super().__init__()
        self.input_shape = (in_channels, image_size, image_size)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 10, 5), nn.MaxPool2d(2), nn.ReLU(),
            nn.Conv2d(10, 20, 5), nn.MaxPool2d(2), nn.ReLU(),
        )
        flat = _flat_size("cnn_small", self.features, self.input_shape)
        self.classifier = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


class CNNBN(_ConvNet):
    """A small CNN with BatchNorm, for methods that need normalisation layers (FedBN): 5x5 convs 16 and 32 ("same"
    padding), each with BatchNorm, ReLU and a 2x2 max-pool, fc 64, fc C (114,410 parameters on 1x28x28 with
    10 classes). No BatchNorm in the classifier: a client's last batch may hold a single sample."""

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int, hidden: int = 64):
        super().__init__()
        self.input_shape = (in_channels, image_size, image_size)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 5, padding=2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        )
        flat = _flat_size("cnn_bn", self.features, self.input_shape)  # 32*7*7 on 28x28
        self.classifier = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
