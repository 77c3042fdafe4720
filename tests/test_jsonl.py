"""dataset=jsonl: Alpaca/Dolly records from a small file the test writes, the byte tokenizer by hand, the
per-category split, Dirichlet skew over categories, and a run of text_decoder in both engines."""

import csv
import json
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from fedagg.data.files import DataError
from fedagg.data.jsonl import byte_tokens, jsonl
from fedagg.data.partition import dirichlet
from fedagg.run import run_experiment
from fedagg.seeding import generator

# Three categories, each with its own words, so that a model can tell them apart
WORDS = {"open_qa": "why what who", "brainstorming": "ideas list many", "classification": "sort label which"}


def write_records(path, per_class=20, array=False, dolly=False):
    records = []
    for i in range(per_class):
        for category, words in WORDS.items():
            record = {"instruction": f"{words} {i}", "input": "" if i % 2 else f"extra {category}",
                      "output": "an answer", "category": category}
            if dolly:  # Dolly's names: context, response
                record = {"instruction": record["instruction"], "context": record["input"], "response": "x",
                          "category": category}
            records.append(record)
    text = json.dumps(records) if array else "\n".join(json.dumps(r) for r in records) + "\n\n"
    path.write_text(text)
    return records


def test_byte_tokens_are_the_utf8_bytes_padded_on_the_left():
    assert byte_tokens(["hé", ""], 5).tolist() == [[0, 0, 104, 195, 169], [0, 0, 0, 0, 0]]
    assert byte_tokens(["hé", "a\0b"], 2).tolist() == [[104, 195], [97, 32]]  # cut at max_length; NUL is a space


def test_records_become_sorted_class_ids_split_per_category(tmp_path):
    records = write_records(tmp_path / "d.jsonl")
    b = jsonl(path=str(tmp_path / "d.jsonl"), max_length=16, test_frac=0.25)
    assert b.inputs == "text" and b.num_classes == 3 and b.train_x.shape == (45, 16) and b.image_size == 16
    # sorted: brainstorming 0, classification 1, open_qa 2; 5 of each category's 20 records are test records
    assert torch.bincount(b.test_y).tolist() == [5, 5, 5] and torch.bincount(b.train_y).tolist() == [15, 15, 15]
    order = sorted(WORDS)
    wanted = {}
    for r in records:
        text = r["instruction"] + (f"\n{r['input']}" if r["input"] else "")
        wanted[tuple(byte_tokens([text], 16)[0].tolist())] = order.index(r["category"])
    for x, y in zip(torch.cat([b.train_x, b.test_x]), torch.cat([b.train_y, b.test_y])):
        assert wanted[tuple(x.tolist())] == int(y)  # every row is one record's text with its own category
    again = jsonl(path=str(tmp_path / "d.jsonl"), max_length=16, test_frac=0.25)
    assert torch.equal(again.test_x, b.test_x)  # the split is the dataset's own seed's
    other = jsonl(path=str(tmp_path / "d.jsonl"), max_length=16, test_frac=0.25, seed=1)
    assert not torch.equal(other.test_x, b.test_x)


def test_alpaca_array_and_dolly_fields_read_alike(tmp_path):
    write_records(tmp_path / "a.json", array=True)
    write_records(tmp_path / "d.jsonl", dolly=True)
    a, d = (jsonl(path=str(tmp_path / f), max_length=24) for f in ("a.json", "d.jsonl"))
    assert torch.equal(a.train_x, d.train_x) and torch.equal(a.test_y, d.test_y)  # context is Dolly's input
    by_output = jsonl(path=str(tmp_path / "a.json"), max_length=24, text_fields=["output"])
    assert (by_output.train_x == by_output.train_x[0]).all()  # every output reads "an answer"


def test_bad_files_are_one_line_naming_the_key(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"instruction": "a", "category": "x"}\n{"instruction": "b"}\n')
    with pytest.raises(DataError, match=r"dataset.label_field='category': record 2 of .* has no such field"):
        jsonl(path=str(path))
    path.write_text('{"instruction": "a", "category": "x"}\nnot json\n')
    with pytest.raises(DataError, match=r"line 2 is not JSON"):
        jsonl(path=str(path))
    with pytest.raises(DataError, match=r"dataset.path='.*nowhere.jsonl': no such file"):
        jsonl(path=str(tmp_path / "nowhere.jsonl"))
    path.write_text('{"instruction": "a", "category": "x"}\n{"instruction": "b", "category": "x"}\n')
    with pytest.raises(DataError, match=r"needs at least two"):
        jsonl(path=str(path))


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_text_decoder_trains_on_skewed_categories_in_both_engines(tmp_path):
    write_records(tmp_path / "d.jsonl", per_class=24)
    common = ["dataset=jsonl", f"dataset.path={tmp_path / 'd.jsonl'}", "dataset.max_length=24", "rounds=2",
              "num_clients=4", "partition.alpha=0.1", "partition.min_size=2", "device=cpu", "model=text_decoder",
              "model.dim=16"]
    rows = {}
    for engine in ("sequential", "parallel"):
        summary = run_experiment([*common, f"engine={engine}"], tmp_path / engine)
        assert summary["status"] == "completed" and summary["choices"]["model"] == "text_decoder"
        rows[engine] = _rows(tmp_path / engine / "metrics.csv")
    for s, p in zip(rows["sequential"], rows["parallel"]):
        assert abs(float(s["train_loss"]) - float(p["train_loss"])) < 1e-4
    clients = json.loads((tmp_path / "sequential" / "partition.json").read_text())["clients"]
    counts = torch.tensor([c["class_counts"] for c in clients])
    assert counts.sum(0).tolist() == [20, 20, 20]  # the 80% of each category's 24 records that train
    # Dirichlet label skew over the categories: what the partition gives on the file's category ids
    labels = jsonl(path=str(tmp_path / "d.jsonl"), max_length=24).train_y
    parts = dirichlet(labels, 4, generator=generator(0, "partition"), alpha=0.1, min_size=2)
    assert counts.tolist() == [torch.bincount(labels[p], minlength=3).tolist() for p in parts]


def test_the_command_line_runs_a_jsonl_file(tmp_path):
    write_records(tmp_path / "d.jsonl", per_class=10)
    run = subprocess.run([sys.executable, "-m", "fedagg.run", "dataset=jsonl", f"dataset.path={tmp_path / 'd.jsonl'}",
                          "rounds=2", "num_clients=2", "partition=iid", "dataset.max_length=16",
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert len(_rows(tmp_path / "run" / "metrics.csv")) == 2
    bad = subprocess.run([sys.executable, "-m", "fedagg.run", "dataset=jsonl", f"dataset.path={tmp_path / 'no.jsonl'}",
                          "rounds=1", f"hydra.run.dir={tmp_path / 'bad'}"], cwd=ROOT, capture_output=True, text=True)
    said = bad.stdout + bad.stderr
    assert bad.returncode != 0 and "Traceback" not in said
    assert "dataset.path=" in said and "no such file" in said


def test_a_hugging_face_tokenizer_or_model_without_transformers_is_one_line(tmp_path, monkeypatch):
    from fedagg.models.hf import HFModel

    write_records(tmp_path / "d.jsonl", per_class=2)
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if the hf extra were not installed
    with pytest.raises(ValueError, match=r"^dataset.tokenizer needs the transformers package: pip install 'fedagg\[hf"):
        jsonl(path=str(tmp_path / "d.jsonl"), tokenizer="some/tokenizer")
    with pytest.raises(ValueError, match=r"^model=hf needs the transformers package"):
        HFModel(num_classes=3, in_channels=1, image_size=8, name_or_path="some/model")
