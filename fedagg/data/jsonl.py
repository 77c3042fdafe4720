"""`dataset=jsonl`: text classification from a local instruction file, in the layout of Alpaca and Dolly.

Each record (a JSON line, or an element of one JSON array as Alpaca's release ships it) has the
fields `instruction`, `input` (Dolly: `context`), `output` (Dolly: `response`) and `category`.
The text a model reads is the non-empty `text_fields` joined by newlines; the label is the
value of `label_field` (by default the category, so `partition=dirichlet` skews the clients'
categories as it skews image classes). Labels become class ids in sorted order, so a file
gives the same ids on every machine. A fixed share of each class (`test_frac`, drawn from the
dataset's own seed) is the test set.

Tokens: `tokenizer: byte` is fedagg's own, offline: a text's UTF-8 bytes are its ids (vocabulary
256, id 0 the padding), cut to `max_length` and padded on the left, so that a causal model's
last position is the text's last byte (model=text_decoder). Any other value names a Hugging Face
tokenizer (a folder, or a hub name in the local cache), as model=hf uses it; the dataset YAML
makes it model.name_or_path when model=hf.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from fedagg.data.datasets import DatasetBundle
from fedagg.data.files import DataError
from fedagg.seeding import generator

log = logging.getLogger(__name__)

BYTE_VOCABULARY = 256
PAD = 0  # the byte tokenizer's padding id (NUL, which text does not contain; a NUL read is a space)


def read_records(path: str) -> list[dict]:
    """The file's records: one JSON object per non-blank line, or one JSON array of objects."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(f"dataset.path={path!r}: no such file; give a JSONL file with one record per line "
                        "(fields instruction, input, output, category)")
    text = file.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"dataset.path={path!r} is not a JSON array of records ({err})") from None
        numbered = list(enumerate(records, start=1))
    else:
        numbered = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    numbered.append((n, json.loads(line)))
                except json.JSONDecodeError as err:
                    raise DataError(f"dataset.path={path!r}: line {n} is not JSON ({err.msg})") from None
    for n, record in numbered:
        if not isinstance(record, dict):
            raise DataError(f"dataset.path={path!r}: record {n} is not a JSON object")
    if not numbered:
        raise DataError(f"dataset.path={path!r} holds no records")
    return [r for _, r in numbered]


def texts_and_labels(records: list[dict], path: str, text_fields: Sequence[str],
                     label_field: str) -> tuple[list[str], list[str]]:
    texts, labels = [], []
    for n, record in enumerate(records, start=1):
        if record.get(label_field) in (None, ""):
            raise DataError(f"dataset.label_field={label_field!r}: record {n} of {path} has no such field "
                            f"(it has {', '.join(record) or 'none'})")
        present = [f for f in text_fields if f in record]
        if not present:
            raise DataError(f"dataset.text_fields={list(text_fields)}: record {n} of {path} has none of them "
                            f"(it has {', '.join(record)})")
        texts.append("\n".join(str(record[f]) for f in present if str(record[f]).strip()))
        labels.append(str(record[label_field]))
    return texts, labels


def byte_tokens(texts: list[str], max_length: int) -> Tensor:
    """[N, max_length] int64: each text's first max_length UTF-8 bytes, padded with PAD on the left."""
    out = torch.full((len(texts), max_length), PAD, dtype=torch.int64)
    for i, text in enumerate(texts):
        ids = list(text.encode("utf-8")[:max_length].replace(b"\0", b" "))
        if ids:
            out[i, max_length - len(ids):] = torch.tensor(ids, dtype=torch.int64)
    return out


def hf_tokens(texts: list[str], name: str, max_length: int) -> Tensor:
    """[N, max_length] int64 ids from a Hugging Face tokenizer, padded (on its own side) with its padding id."""
    from fedagg.models.hf import from_hub, transformers_or_refusal  # transformers is an extra

    tok = from_hub(transformers_or_refusal("dataset.tokenizer").AutoTokenizer, name, "dataset.tokenizer")
    if tok.pad_token is None:  # GPT-2-like tokenizers have none; their end-of-text token pads
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    enc = tok(texts, truncation=True, max_length=max_length, padding="max_length", return_tensors="pt")
    return enc["input_ids"].long()


def stratified_test(labels: Tensor, test_frac: float, seed: int) -> Tensor:
    """Boolean [N]: floor(test_frac * n_c) samples of each class c, drawn from the dataset's own stream."""
    g = generator(seed, "jsonl_split")
    test = torch.zeros(len(labels), dtype=torch.bool)
    for c in range(int(labels.max()) + 1):
        idx = (labels == c).nonzero().flatten()
        test[idx[torch.randperm(len(idx), generator=g)[: int(test_frac * len(idx))]]] = True
    return test


def jsonl(root: str | None = None, *, path: str | None = None, label_field: str = "category",
          text_fields: Sequence[str] = ("instruction", "input", "context"), tokenizer: str = "byte",
          max_length: int = 128, test_frac: float = 0.2, seed: int = 0, download: bool = False,
          default_model: str | None = None) -> DatasetBundle:
    """Token ids [N, max_length] (int64) and class ids of `label_field`, split per class into train and test."""
    del root, download, default_model  # a local file; default_model: the backbone fedagg.run trains when none is chosen
    if not path:
        raise ValueError("dataset.path is not set; dataset=jsonl needs dataset.path=FILE (a JSONL file of records "
                         "with instruction, input, output, category)")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"dataset.max_length={max_length!r} is not allowed; use an integer >= 1 (tokens per text)")
    if isinstance(test_frac, bool) or not isinstance(test_frac, (int, float)) or not 0 < test_frac < 1:
        raise ValueError(f"dataset.test_frac={test_frac!r} is not allowed; use a fraction in (0, 1)")
    texts, names = texts_and_labels(read_records(path), path, list(text_fields), label_field)
    classes = sorted(set(names))
    if len(classes) < 2:
        raise DataError(f"dataset.label_field={label_field!r}: every record of {path} has the label {classes[0]!r}; "
                        "a classification task needs at least two")
    labels = torch.tensor([classes.index(n) for n in names], dtype=torch.int64)
    log.info("jsonl: %d records, %d classes of %s: %s", len(labels), len(classes), label_field, ", ".join(classes))
    x = byte_tokens(texts, max_length) if tokenizer == "byte" else hf_tokens(texts, tokenizer, max_length)
    test = stratified_test(labels, float(test_frac), seed)
    if not test.any():
        raise DataError(f"dataset.test_frac={test_frac} leaves no test record in {path} ({len(labels)} records); "
                        "use a larger test_frac or a larger file")
    return DatasetBundle("jsonl", x[~test].contiguous(), labels[~test], x[test].contiguous(), labels[test],
                         len(classes), (0.0,), (1.0,), False, inputs="text")
