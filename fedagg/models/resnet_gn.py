"""ResNet-18 with group norm (Reddi et al. 2021, "Adaptive Federated Optimization", Sec. 5 and
App. C: ResNet-18 for CIFAR-10 and CIFAR-100 "replacing batch norm with group norm", Hsieh et
al. 2020, 2 groups per layer). Group norm keeps no running statistics, so nothing but the
trained weights is averaged across clients, and it behaves the same at any batch size.

torchvision's resnet18 with every BatchNorm2d replaced by GroupNorm(groups, C); the stems are
those of `fedagg.models.resnet_imagenet` (`stem: cifar` by default: a 3x3/1 conv and no
max-pool at the dataset's own size, for 32x32 images).

`block: preact` builds the pre-activation (v2) network of the authors' TFF code instead
(fedagg/models/resnet_preact.py), with the same stems; `stem: imagenet` with `input_size: null`
is their 7x7/2 conv + 3x3/2 max-pool at the images' own size (24x24 with `dataset.crop: 24`).
`norm_eps` is every GroupNorm's epsilon: PyTorch's 1e-5 by default; the authors' layer (tfa's
GroupNormalization, tensorflow/addons@0584b2a) uses 1e-3, which the FedOpt table sets."""
from torch import Tensor, nn

from fedagg.config.constraints import checked
from fedagg.models.resnet_imagenet import InputSize, ResNet18
from fedagg.models.resnet_preact import PreActResNet18

BLOCKS = ("basic", "preact")


class ResNet18GN(ResNet18):
    @checked("model.")
    def __init__(self, *, num_classes: int, in_channels: int, image_size: int, groups: int = 2,
                 stem: str = "cifar", input_size: InputSize | None = None, block: str = "basic",
                 norm_eps: float = 1e-5):
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or 64 % groups:
            raise ValueError(f"model.groups={groups!r} is not allowed; it must divide 64 (the narrowest layer), e.g. 2")
        if block not in BLOCKS:
            raise ValueError(f"model.block={block!r} is not allowed; choose one of {', '.join(BLOCKS)} "
                             f"(basic: torchvision's v1 blocks; preact: the FedOpt authors' v2 network)")
        if isinstance(norm_eps, bool) or not isinstance(norm_eps, (int, float)) or not 0 < norm_eps < 1:
            raise ValueError(f"model.norm_eps={norm_eps!r} is not allowed; it must be a number in (0, 1), e.g. 1e-5")
        super().__init__(num_classes=num_classes, in_channels=in_channels, image_size=image_size,
                         input_size=input_size, stem=stem)
        self.block = block
        if block == "preact":  # the stem check and input_shape above stand; the layers are v2's
            channels = self.input_shape[0]
            self.net = PreActResNet18(num_classes, channels, groups, stem, float(norm_eps))
        else:
            _swap_norms(self.net, groups, float(norm_eps))

    def encode(self, x: Tensor) -> Tensor:
        return self.net.features(x) if self.block == "preact" else super().encode(x)


def _swap_norms(module: nn.Module, groups: int, eps: float) -> None:
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            # torchvision's own init for norms: weight 1, bias 0 (GroupNorm's default too)
            setattr(module, name, nn.GroupNorm(groups, child.num_features, eps))
        else:
            _swap_norms(child, groups, eps)
