"""TFF's EMNIST character model, the one Reddi et al. 2021 ("Adaptive Federated Optimization")
trained on EMNIST CR: google-research/federated `utils/models/emnist_models.py`,
`create_conv_dropout_model(only_digits=False)` (facts E of the sources listed in conf/experiment/fedopt_table2.yaml).
It is not LEAF's FEMNIST CNN (`cnn_femnist`, 5x5 convs and fc 2048).

conv3x3-32 (valid) -> ReLU -> conv3x3-64 (valid) -> ReLU -> max-pool 2 -> dropout 0.25 -> flatten
-> dense 128 -> ReLU -> dropout 0.5 -> dense C. On 1x28x28 with 62 classes: 320 + 18,496 +
1,179,776 (12*12*64 = 9,216 inputs to the dense layer) + 7,998 = 1,206,590 parameters.
Weights start as Keras's GlorotNormal (a normal truncated at two standard deviations, scaled so
that its standard deviation is sqrt(2 / (fan_in + fan_out))), biases at 0, as that model's
initializer. The model ends in a softmax there; here the logits go to the cross-entropy, the same loss.
Dropout is active in training only; its masks come from the run's seed (each engine seeds torch's generator for
its training: per client and round in the sequential engine, per round in the parallel one, which draws each
client its own masks), so they differ between the engines, and a stacked sweep trains such a run alone.
"""

import math

import torch
from torch import nn

from fedagg.models.cnns import _ConvNet, _flat_size

# the standard deviation of a unit normal truncated to [-2, 2]: Keras divides by it so that the
# truncated draw has the requested standard deviation
_TRUNCATED_STD = 0.87962566103423978


def glorot_normal_(weight: torch.Tensor) -> None:
    receptive = weight[0, 0].numel() if weight.dim() > 2 else 1
    fan_in, fan_out = weight.shape[1] * receptive, weight.shape[0] * receptive
    std = math.sqrt(2.0 / (fan_in + fan_out)) / _TRUNCATED_STD
    nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)


class CNNEmnistTFF(_ConvNet):
    def __init__(self, *, num_classes: int, in_channels: int, image_size: int, dropout_conv: float = 0.25,
                 dropout_dense: float = 0.5):
        super().__init__()
        for key, p in (("dropout_conv", dropout_conv), ("dropout_dense", dropout_dense)):
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
                raise ValueError(f"model.{key}={p!r} is not allowed; it must be in [0, 1) (0: no dropout)")
        self.input_shape = (in_channels, image_size, image_size)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3), nn.ReLU(),
            nn.Conv2d(32, 64, 3), nn.ReLU(),
            nn.MaxPool2d(2), nn.Dropout(dropout_conv),
        )
        flat = _flat_size("cnn_emnist_tff", self.features, self.input_shape)
        self.classifier = nn.Sequential(nn.Linear(flat, 128), nn.ReLU(), nn.Dropout(dropout_dense),
                                        nn.Linear(128, num_classes))
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                glorot_normal_(m.weight)
                nn.init.zeros_(m.bias)
