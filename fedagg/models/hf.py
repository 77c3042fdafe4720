"""`model=hf`: a Hugging Face `transformers` model by hub name or local folder (`model.name_or_path`).

The auto class follows the task: `sequence_classification` (text classification, dataset=jsonl;
the classifier head is new when the checkpoint has another number of labels),
`image_classification` (the image datasets, resized and repeated to the checkpoint's
channels by the data pipeline, as for resnet18) or `causal_lm` (next-token datasets whose
vocabulary is the checkpoint's). `auto` picks image classification for a vision config (one
with `num_channels`), else sequence classification. `peft`: a PEFT adapter folder (LoRA and
the like, `save_pretrained` of a PeftModel) merged into the weights after loading, so that a
run starts from base plus adapter as one plain model.

A hub name is read from the local Hugging Face cache when it is there; a name that is neither
a folder nor cached, on a machine that cannot reach the hub (or with HF_HUB_OFFLINE=1), is one
line naming the key before any training. Weights are float32 and attention is the eager
implementation: its plain matmuls stack under the parallel engine's vmap as fedagg's own
transformers do. Dropout is the checkpoint's own; its masks differ between the engines.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor, nn

TASKS = ("auto", "sequence_classification", "image_classification", "causal_lm")
AUTO_CLASSES = {"sequence_classification": "AutoModelForSequenceClassification",
                "image_classification": "AutoModelForImageClassification", "causal_lm": "AutoModelForCausalLM"}


def transformers_or_refusal(key: str = "model=hf"):
    """The transformers package, or one line saying which extra to install for `key`."""
    try:
        import transformers
    except ImportError:
        raise ValueError(f"{key} needs the transformers package: pip install 'fedagg[hf]'") from None
    return transformers


def from_hub(cls, name: str | None, key: str, **kwargs):
    """`cls.from_pretrained(name, **kwargs)`, with a missing or unreachable model as one line naming `key`."""
    if not name:
        raise ValueError(f"{key} is not set; give a Hugging Face model name or a local folder (save_pretrained's)")
    local = Path(str(name)).expanduser()
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # its load report and progress bars: a new head is expected here
    hf_logging.disable_progress_bar()
    try:
        return cls.from_pretrained(str(local) if local.is_dir() else str(name), **kwargs)
    except (OSError, ValueError, ConnectionError, ImportError) as err:
        if local.is_dir():
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ValueError(f"{key}={str(name)!r}: cannot load the folder with {cls.__name__} ({first})") from None
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
            why = "this machine is offline: HF_HUB_OFFLINE is set"
        elif "connect" in str(err).lower():
            why = "this machine is offline: the Hugging Face hub cannot be reached"
        else:
            why = "the Hugging Face hub has no such model, or it needs a login"
        raise ValueError(f"{key}={str(name)!r} is not a local folder nor in the Hugging Face cache ({why}); "
                         f"download it where there is network (save_pretrained) and give its folder") from None
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


class HFModel(nn.Module):
    """A transformers model behind fedagg's model call: ids [B, T] (or images [B, C, H, W]) -> logits."""

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int, name_or_path: str | None = None,
                 task: str = "auto", peft: str | None = None, revision: str | None = None):
        super().__init__()
        del in_channels  # an image checkpoint's channels are its own; the data pipeline repeats grey to fit
        if task not in TASKS:
            raise ValueError(f"model.task={task!r} is not allowed; use one of {', '.join(TASKS)}")
        tf = transformers_or_refusal()
        kw = {} if revision is None else {"revision": revision}
        config = from_hub(tf.AutoConfig, name_or_path, "model.name_or_path", **kw)
        if task == "auto":
            task = "image_classification" if hasattr(config, "num_channels") else "sequence_classification"
        self.task = task
        if task == "causal_lm":
            if config.vocab_size != num_classes:
                raise ValueError(f"model.name_or_path={name_or_path!r} predicts {config.vocab_size} tokens but the "
                                 f"dataset has {num_classes}; model.task=causal_lm needs the dataset's vocabulary")
        else:
            kw.update(num_labels=num_classes, ignore_mismatched_sizes=True)  # a new head for this run's classes
        auto = getattr(tf, AUTO_CLASSES[task])
        self.net = from_hub(auto, name_or_path, "model.name_or_path", attn_implementation="eager", **kw).float()
        if peft:
            self.net = self._merged(self.net, peft)
        cfg = self.net.config
        if task == "image_classification":
            side = cfg.image_size if isinstance(cfg.image_size, int) else cfg.image_size[0]
            self.input_shape, self.pad_id, self.causal = (cfg.num_channels, side, side), None, False
            return
        self.input_shape = (image_size,)
        if cfg.pad_token_id is None:  # GPT-2-like: its end-of-text pads (sequence classification finds the last token)
            cfg.pad_token_id = cfg.eos_token_id if isinstance(cfg.eos_token_id, int) else 0
        self.pad_id = cfg.pad_token_id
        self.causal = task == "causal_lm" or _attends_ahead_only(self.net)

    @staticmethod
    def _merged(net: nn.Module, folder: str) -> nn.Module:
        try:
            from peft import PeftModel
        except ImportError:
            raise ValueError("model.peft needs the peft package: pip install 'fedagg[hf]'") from None
        return from_hub(_PeftOn(PeftModel, net), folder, "model.peft").merge_and_unload()

    def forward(self, x: Tensor) -> Tensor:
        if self.task == "image_classification":
            return self.net(pixel_values=x).logits
        return self.net(input_ids=x, attention_mask=self.mask(x)).logits

    def mask(self, ids: Tensor) -> Tensor:
        """The additive attention mask [B, 1, T, T]: 0 where a position may attend (a token that is not padding,
        and for a causal model one not after it), the dtype's minimum elsewhere. transformers uses a 4D mask as
        it is, where from a 2D one it builds its own with a data-dependent branch that vmap cannot stack."""
        t = ids.shape[-1]
        keep = (ids != self.pad_id)[:, None, None, :].expand(-1, 1, t, t)
        if self.causal:
            keep = keep & torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        zero = torch.zeros((), device=ids.device)
        return torch.where(keep, zero, torch.finfo(torch.float32).min)


def _attends_ahead_only(net: nn.Module) -> bool:
    """Whether the checkpoint's body is causal (GPT-2, Llama) rather than bidirectional (BERT): the first
    position's hidden state of two sequences that differ only in their second token is the same."""
    with torch.no_grad():
        ids = torch.tensor([[1, 2], [1, 3]], device=next(net.parameters()).device)
        hidden = net.base_model(input_ids=ids).last_hidden_state
    return bool(torch.allclose(hidden[0, 0], hidden[1, 0]))


class _PeftOn:
    """PeftModel.from_pretrained with its base bound, so from_hub can call it like an auto class."""

    def __init__(self, cls, base: nn.Module):
        self.cls, self.base, self.__name__ = cls, base, cls.__name__

    def from_pretrained(self, name: str, **kwargs):
        return self.cls.from_pretrained(self.base, name, **kwargs)
