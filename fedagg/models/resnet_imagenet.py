"""torchvision's ResNet18/34 with a fresh classifier (EWWA-FL's paper (Hu et al. 2023) Sec. IV: "derivatives
from PyTorch's official offerings", 224x224x3 input; FedAWA's paper (Shi et al. 2025) Sec. 5.1: ResNet18 on
Tiny-ImageNet). Never loads pretrained weights.

stem="imagenet": the stock 7x7/2 conv + max-pool on 3 x input_size x input_size (224 by
default); the data pipeline upsamples and repeats grey channels to reach that shape.
stem="cifar": a 3x3/1 conv and no max-pool at the dataset's own size and channels, the usual
adaptation that keeps 32x32 images from shrinking to 1x1 before the last stage; input_size is
then ignored, so `model.stem=cifar` alone is enough on the command line."""
from typing import Annotated

import torch
import torchvision
from torch import Tensor, nn

from fedagg.config.constraints import Range, checked
from fedagg.models.base import Backbone

# pixels a side of the stock stem's input (any size from 1 passes its adaptive pooling); refused before anything is
# built, also with stem: cifar, which ignores it: a size below 1 is a mistake wherever it is typed
InputSize = Annotated[int, Range(ge=1, integer=True, words="it must be an integer >= 1 (pixels a side), or null for "
                                                           "the images' own size")]


class _TorchvisionResNet(Backbone):
    builder = None  # torchvision constructor, set by subclasses
    classifier_name = "net.fc"

    @checked("model.")
    def __init__(self, *, num_classes: int, in_channels: int, image_size: int,
                 input_size: InputSize | None = 224, stem: str = "imagenet"):
        super().__init__()
        net = type(self).builder(weights=None, num_classes=num_classes)
        if stem == "imagenet":
            # None means "no upsampling": the stock stem at the dataset's own size.
            size = image_size if input_size is None else int(input_size)
            self.input_shape = (3, size, size)
        elif stem == "cifar":
            self.input_shape = (in_channels, image_size, image_size)
            net.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
            # Same init torchvision gives its own conv1.
            nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
            net.maxpool = nn.Identity()
        else:
            raise ValueError(f"stem must be 'imagenet' or 'cifar', got {stem!r}")
        self.net = net

    def encode(self, x: Tensor) -> Tensor:
        net = self.net  # torchvision's ResNet._forward_impl up to its classifier
        x = net.maxpool(net.relu(net.bn1(net.conv1(x))))
        x = net.layer4(net.layer3(net.layer2(net.layer1(x))))
        return torch.flatten(net.avgpool(x), 1)

    def classify(self, h: Tensor) -> Tensor:
        return self.net.fc(h)


class ResNet18(_TorchvisionResNet):
    builder = staticmethod(torchvision.models.resnet18)


class ResNet34(_TorchvisionResNet):
    builder = staticmethod(torchvision.models.resnet34)
