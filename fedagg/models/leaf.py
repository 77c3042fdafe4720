"""LEAF's backbones for its federated datasets (Caldas et al. 2018; FedProx uses the same):
`cnn_femnist` for FEMNIST and `lstm_shakespeare` for Shakespeare's next-character task.

The LSTM is written from linear layers rather than nn.LSTM so that the parallel engine can
stack clients: nn.LSTM's fused kernel takes its weights as flat buffers that
torch.func.vmap cannot batch, while a linear layer is one of the packed layers
(engines/_packed.py) that turns K clients' weights into one batched matmul. The recurrence
is nn.LSTM's (gates i, f, g, o; two biases; uniform(±1/√H) initialisation), which a test
checks against nn.LSTM itself.
"""

import math

import torch
from torch import Tensor, nn

from fedagg.models.base import Backbone
from fedagg.models.cnns import CNNMnist


class CNNFemnist(CNNMnist):
    """LEAF's FEMNIST CNN: McMahan et al.'s CNN (5x5 convs 32 and 64, "same" padding, each with ReLU and a 2x2
    max-pool) with fc 2048 before fc C (6,603,710 parameters on 1x28x28 with 62 classes)."""

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int):
        super().__init__(num_classes=num_classes, in_channels=in_channels, image_size=image_size, hidden=2048,
                         name="cnn_femnist")


class LSTMLayer(nn.Module):
    """One LSTM layer over [B, T, input] -> [B, T, hidden], from zero state; nn.LSTM's arithmetic."""

    def __init__(self, input_size: int, hidden: int):
        super().__init__()
        self.hidden = hidden
        self.ih = nn.Linear(input_size, 4 * hidden)
        self.hh = nn.Linear(hidden, 4 * hidden)
        bound = 1 / math.sqrt(hidden)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        gates_x = self.ih(x)  # every step's input projection in one matmul
        h = c = torch.zeros_like(gates_x[:, 0, : self.hidden])  # batched like x under vmap
        outputs = []
        for t in range(x.shape[1]):
            i, f, g, o = (gates_x[:, t] + self.hh(h)).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        return torch.stack(outputs, 1)


class LSTMShakespeare(Backbone):
    """LEAF's / FedProx's character model: embedding 8, two LSTM layers of 256, a linear layer to the vocabulary,
    applied at every position: token ids [B, T] -> logits [B, T, V]. Built by the same call as the image models:
    `num_classes` is the vocabulary and `image_size` the sequence length (DatasetBundle.image_size). Its
    representation is the last LSTM layer's output at every position, [B, T, hidden]."""

    classifier_name = "out"
    takes = "tokens"

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int, embedding: int = 8,
                 hidden: int = 256, layers: int = 2):
        super().__init__()
        del in_channels
        self.input_shape = (image_size,)
        self.embed = nn.Embedding(num_classes, embedding)
        self.layers = nn.ModuleList(LSTMLayer(embedding if i == 0 else hidden, hidden) for i in range(layers))
        self.out = nn.Linear(hidden, num_classes)

    def encode(self, tokens: Tensor) -> Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return h

    def classify(self, h: Tensor) -> Tensor:
        return self.out(h)
