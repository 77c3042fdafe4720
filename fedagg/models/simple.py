"""Linear baselines that take the dataset's images at their native shape."""
import math

from torch import Tensor, nn

from fedagg.models.base import Backbone, run_through


class MLR(Backbone):
    """Multinomial logistic regression (FedAdp's paper (Wu & Wang 2021) Sec. V and footnote 3, its convex model): flatten -> linear.
    Its one layer is its last: the representation is the flattened input."""

    classifier_name = "fc"

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int):
        super().__init__()
        self.input_shape = (in_channels, image_size, image_size)
        self.fc = nn.Linear(math.prod(self.input_shape), num_classes)

    def encode(self, x: Tensor) -> Tensor:
        return x.flatten(1)

    def classify(self, h: Tensor) -> Tensor:
        return self.fc(h)


class MLP(Backbone):
    """One hidden ReLU layer; 64 wide in aggregation-comparison…txt Sec. 3 ("Models")."""

    classifier_name = "net.3"

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int, hidden: int = 64):
        super().__init__()
        self.input_shape = (in_channels, image_size, image_size)
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(math.prod(self.input_shape), hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def encode(self, x: Tensor) -> Tensor:
        return run_through(self.net, x, -1)

    def classify(self, h: Tensor) -> Tensor:
        return self.net[-1](h)
