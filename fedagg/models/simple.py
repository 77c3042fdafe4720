"""Linear baselines that take the dataset's images at their native shape."""
import math

from torch import nn


class MLR(nn.Module):
    """Multinomial logistic regression (fedadp.txt Sec. V and footnote 3, its convex model): flatten -> linear."""

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int):
        super().__init__()
        self.input_shape = (in_channels, image_size, image_size)
        self.fc = nn.Linear(math.prod(self.input_shape), num_classes)

    def forward(self, x):
        return self.fc(x.flatten(1))


class MLP(nn.Module):
    """One hidden ReLU layer; 64 wide in aggregation-comparison…txt Sec. 3 ("Models")."""

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int, hidden: int = 64):
        super().__init__()
        self.input_shape = (in_channels, image_size, image_size)
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(math.prod(self.input_shape), hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.net(x)
