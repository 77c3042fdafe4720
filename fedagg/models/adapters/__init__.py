"""Adapters on a frozen base (`adapter=lora`): the model side (`lora.py`, `frozen.py`) and where the factors sit in
the flat vector (`layout.py`), for the rules that read them."""

from fedagg.models.adapters.frozen import FrozenBase, plain_tensors
from fedagg.models.adapters.layout import AdapterLayout, Pair
from fedagg.models.adapters.lora import Adapters, LoRA, NoAdapter

__all__ = ["AdapterLayout", "Adapters", "FrozenBase", "LoRA", "NoAdapter", "Pair", "plain_tensors"]
