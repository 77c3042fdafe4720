"""`model=char_decoder` and `model=text_decoder`: a small causal transformer (GPT-2's layout) over token ids.

Token ids [B, T] are embedded, learned position embeddings added, `depth` causal pre-norm
blocks (models/transformer.py) and a final LayerNorm applied. Two heads, one class:
- `head: lm` (char_decoder): next-token logits at every position, [B, T, V], for the character
  datasets (shakespeare), whose classes are the vocabulary; what lstm_shakespeare computes.
- `head: last` (text_decoder): class logits from the last position, [B, C], for text
  classification (dataset=jsonl). The position sees the whole sequence, and the dataset pads on
  the left, so the last position is always the text's last token. The vocabulary is then
  `vocab_size` (the dataset's tokenizer's; 256 for fedagg's byte tokenizer).
With `pretrained`, the weights come from a base file (models/pretrained.py).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fedagg.models.base import Backbone
from fedagg.models.pretrained import load_base
from fedagg.models.transformer import Block, check_shape

HEADS = ("lm", "last")


class Decoder(Backbone):
    """Token ids [B, T] -> logits [B, T, V] (`head=lm`) or [B, C] (`head=last`). Built by the same call as the
    image models: `image_size` is the sequence length (DatasetBundle.image_size). Its representation is the final
    LayerNorm's output, per position for `lm` ([B, T, dim]) and at the last position for `last` ([B, dim])."""

    classifier_name = "out"

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int, head: str = "lm",
                 vocab_size: int | None = None, dim: int = 64, depth: int = 4, heads: int = 4, mlp_ratio: int = 2,
                 pretrained: str | None = None):
        super().__init__()
        del in_channels
        if head not in HEADS:
            raise ValueError(f"model.head={head!r} is not allowed; use one of {', '.join(HEADS)}")
        check_shape("the decoder", dim, heads, depth)
        vocab = num_classes if head == "lm" else vocab_size
        if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 2:
            raise ValueError(f"model.vocab_size={vocab_size!r} is not allowed with model.head=last; use the "
                             f"dataset's vocabulary size (256 for dataset.tokenizer=byte)")
        self.head = head
        self.arch = dict(head=head, vocab=vocab, length=image_size, dim=dim, depth=depth, heads=heads,
                         mlp_ratio=mlp_ratio)
        self.input_shape = (image_size,)
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, image_size, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio, causal=True) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, num_classes)
        if pretrained:
            load_base(self, pretrained)

    def encode(self, tokens: Tensor) -> Tensor:
        h = self.embed(tokens) + self.pos[:, : tokens.shape[-1]]
        for block in self.blocks:
            h = block(h)
        h = self.norm(h)
        return h if self.head == "lm" else h[:, -1]

    def classify(self, h: Tensor) -> Tensor:
        return self.out(h)
