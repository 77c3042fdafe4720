"""The pre-activation (v2) ResNet-18 with group norm that Reddi et al. 2021 trained on CIFAR:
google-research/federated@0b7d004:utils/models/resnet_models.py (`create_resnet18`, facts C of
the sources listed in conf/experiment/fedopt_table2.yaml). `model.block=preact` of `resnet18_gn` builds it.

As that code builds it (read, not guessed; each point differs from torchvision's v1 ResNet-18):
- stem: conv (no bias) -> norm -> ReLU -> max-pool; blocks: norm -> ReLU -> conv, twice, added to the
  input; the first block of the first stage starts with its conv (the stem ends in norm -> ReLU);
  a norm -> ReLU after the last stage, then global average pooling and the dense layer.
- the shortcut is a 1x1 conv **followed by a norm** where the channels change (stages 2-4).
- every stage runs at stride 1: `create_resnet` never passes strides to `_residual_block`, so
  after the stem (24x24 -> 12 -> 6) all four stages work on 6x6 maps.
- the norms are tfa's GroupNormalization, epsilon 1e-3 (tensorflow/addons@0584b2a); `eps` here, 1e-3 in the
  FedOpt table, PyTorch's 1e-5 by default (resnet18_gn's `norm_eps`).
- weights start as Keras's HeNormal (a truncated normal, std sqrt(2 / fan_in)); the dense
  layer's as N(0, 0.01^2); biases 0.
Keras pads 'same' convolutions and pools asymmetrically on even sizes (the extra row at the
bottom); PyTorch's symmetric padding gives maps of the same sizes, shifted by one pixel there.
Parameters with 100 classes: 11,227,812 (convs 11,166,912, norms 9,600, dense 51,300; by hand in
tests/test_models_fedopt.py), the same count as torchvision's ResNet-18.
"""

import math

import torch
from torch import Tensor, nn

from fedagg.models.tff import _TRUNCATED_STD


def he_normal_(weight: Tensor) -> None:
    fan_in = weight[0].numel()
    std = math.sqrt(2.0 / fan_in) / _TRUNCATED_STD
    nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)


def _conv(cin: int, cout: int, k: int, stride: int = 1) -> nn.Conv2d:
    conv = nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)
    he_normal_(conv.weight)
    return conv


class PreActBlock(nn.Module):
    """[norm -> ReLU ->] conv3x3 -> norm -> ReLU -> conv3x3, plus the input (1x1 conv + norm where channels change)."""

    def __init__(self, cin: int, cout: int, groups: int, first: bool, eps: float = 1e-5):
        super().__init__()
        self.pre = nn.Identity() if first else nn.Sequential(nn.GroupNorm(groups, cin, eps), nn.ReLU())
        self.conv1 = _conv(cin, cout, 3)
        self.mid = nn.Sequential(nn.GroupNorm(groups, cout, eps), nn.ReLU())
        self.conv2 = _conv(cout, cout, 3)
        self.shortcut = (nn.Identity() if cin == cout
                         else nn.Sequential(_conv(cin, cout, 1), nn.GroupNorm(groups, cout, eps)))

    def forward(self, x: Tensor) -> Tensor:
        return self.shortcut(x) + self.conv2(self.mid(self.conv1(self.pre(x))))


class PreActResNet18(nn.Module):
    """`features(x)` [B, 512] (after the final norm -> ReLU and pooling) and `fc` (the dense layer)."""

    def __init__(self, num_classes: int, in_channels: int, groups: int, stem: str, eps: float = 1e-5):
        super().__init__()
        if stem == "imagenet":  # 7x7/2 conv + 3x3/2 max-pool (create_resnet's initial_* defaults)
            self.stem = nn.Sequential(_conv(in_channels, 64, 7, stride=2), nn.GroupNorm(groups, 64, eps), nn.ReLU(),
                                      nn.MaxPool2d(3, stride=2, padding=1))
        else:  # cifar: 3x3/1 and no pool, as resnet18_gn's own cifar stem
            self.stem = nn.Sequential(_conv(in_channels, 64, 3), nn.GroupNorm(groups, 64, eps), nn.ReLU())
        blocks, cin = [], 64
        for stage, cout in enumerate((64, 128, 256, 512)):
            for i in range(2):
                blocks.append(PreActBlock(cin, cout, groups, first=stage == 0 and i == 0, eps=eps))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.post = nn.Sequential(nn.GroupNorm(groups, 512, eps), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(512, num_classes)
        nn.init.normal_(self.fc.weight, std=0.01)
        nn.init.zeros_(self.fc.bias)

    def features(self, x: Tensor) -> Tensor:
        return torch.flatten(self.post(self.blocks(self.stem(x))), 1)
