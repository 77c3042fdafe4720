"""CIFAR ResNets (He et al. 2016, Sec. 4.2): a 3x3 stem of 16 channels, three stages of n
BasicBlocks at widths 16/32/64, global average pooling, one linear layer; depth 6n+2.
The layout and init follow akamaster/pytorch_resnet_cifar10, which EWWA-FL's paper (Hu et al. 2023) footnote 3
names as its ResNet-20/32."""
import torch.nn.functional as F
from torch import Tensor, nn

from fedagg.models.base import Backbone


class _PadShortcut(nn.Module):
    """Option A: a parameter-free shortcut. Subsample by 2 and zero-pad the new channels,
    so the block adds no weights (ResNet20 stays at 0.27M)."""

    def __init__(self, extra_channels: int):
        super().__init__()
        self.extra = extra_channels

    def forward(self, x):
        half = self.extra // 2
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, half, self.extra - half))


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, shortcut: str):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        if stride == 1 and cin == cout:
            self.shortcut = nn.Identity()
        elif shortcut == "A":
            self.shortcut = _PadShortcut(cout - cin)
        else:  # "B": 1x1 conv + BN projection (fedagg's design: FedAWA's ResNet20)
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class _CifarResNet(Backbone):
    classifier_name = "fc"

    def __init__(self, *, blocks_per_stage: int, num_classes: int, in_channels: int,
                 image_size: int, shortcut: str = "A"):
        super().__init__()
        shortcut = str(shortcut).upper()
        if shortcut not in ("A", "B"):
            raise ValueError(f"shortcut must be 'A' (zero-padding) or 'B' (1x1 conv), got {shortcut!r}")
        # Global average pooling makes any size work (8x8 digits end at 2x2).
        self.input_shape = (in_channels, image_size, image_size)
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        stages, cin = [], 16
        for i, width in enumerate((16, 32, 64)):
            for j in range(blocks_per_stage):
                stride = 2 if i > 0 and j == 0 else 1
                stages.append(_BasicBlock(cin, width, stride, shortcut))
                cin = width
        self.layers = nn.Sequential(*stages)
        self.fc = nn.Linear(64, num_classes)
        # akamaster's init: Kaiming-normal on every conv and linear weight.
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)

    def encode(self, x: Tensor) -> Tensor:
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        return F.adaptive_avg_pool2d(out, 1).flatten(1)

    def classify(self, h: Tensor) -> Tensor:
        return self.fc(h)


class ResNet20(_CifarResNet):
    """EWWA-FL's paper (Hu et al. 2023) Sec. IV and FedAWA's paper (Shi et al. 2025) Sec. 5.1 (CIFAR, with option B): 3 blocks per stage."""

    def __init__(self, **kwargs):
        super().__init__(blocks_per_stage=3, **kwargs)


class ResNet32(_CifarResNet):
    """EWWA-FL's paper (Hu et al. 2023) Sec. IV: 5 blocks per stage."""

    def __init__(self, **kwargs):
        super().__init__(blocks_per_stage=5, **kwargs)
