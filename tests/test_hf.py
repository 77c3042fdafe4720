"""model=hf: tiny transformers models built here and saved with save_pretrained, loaded back through the path a
hub name takes (never a hub: HF_HUB_OFFLINE=1); their logits against transformers' own call, both engines, a
PEFT adapter merged in, and the one line for a model this offline machine cannot get."""

import csv
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from test_jsonl import WORDS, write_records

# before huggingface_hub is imported: it reads the setting once, and a hub it may try would cost a network timeout
os.environ["HF_HUB_OFFLINE"] = "1"
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from fedagg.data.jsonl import jsonl  # noqa: E402
from fedagg.models.hf import HFModel  # noqa: E402
from fedagg.run import run_experiment  # noqa: E402

VOCAB = ["[PAD]", "[UNK]", *sorted({w for words in WORDS.values() for w in words.split()} | set(WORDS)),
         "extra", *map(str, range(30))]
SMALL = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
             max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A 1-layer BERT classifier of 5 labels and its word-level tokenizer, in one save_pretrained folder."""
    folder = tmp_path_factory.mktemp("bert")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(VOCAB), num_labels=5, pad_token_id=0, **SMALL)
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    _tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=len(VOCAB), n_positions=64, n_embd=16, n_layer=1, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, num_labels=2)
    transformers.GPT2ForSequenceClassification(config).save_pretrained(folder)
    return folder


def _direct(cls, folder, head):
    """transformers' own model of `folder`, with `head`'s classifier weights (the run's new head)."""
    net = cls.from_pretrained(folder, num_labels=3, ignore_mismatched_sizes=True, attn_implementation="eager").float()
    net.load_state_dict(head.state_dict())
    net.config.pad_token_id = head.config.pad_token_id
    return net.eval()


def test_bert_loads_its_body_gets_a_new_head_and_masks_padding(bert):
    model = HFModel(num_classes=3, in_channels=1, image_size=8, name_or_path=str(bert)).eval()
    saved = transformers.BertForSequenceClassification.from_pretrained(bert)
    assert torch.equal(model.net.bert.embeddings.word_embeddings.weight, saved.bert.embeddings.word_embeddings.weight)
    assert model.net.classifier.weight.shape == (3, 16) and model.input_shape == (8,) and not model.causal
    x = torch.tensor([[5, 6, 7, 0, 0, 0, 0, 0], [4, 9, 3, 8, 2, 6, 7, 0]])
    direct = _direct(transformers.BertForSequenceClassification, bert, model.net)
    with torch.no_grad():
        torch.testing.assert_close(model(x), direct(input_ids=x, attention_mask=(x != 0).long()).logits)
        torch.testing.assert_close(model(x)[:1], model(x[:1, :3]))  # padding changes nothing
        body = model.net.bert  # unmasked padding would change the representation the head reads
        masked, unmasked = body(input_ids=x[:1], attention_mask=model.mask(x[:1])), body(input_ids=x[:1])
        # small random weights attend almost evenly, so padding moves the states by ~1e-3: far above rounding
        assert (masked.last_hidden_state[:, :3] - unmasked.last_hidden_state[:, :3]).abs().max() > 1e-3


def test_a_causal_checkpoint_is_masked_causally(gpt2):
    model = HFModel(num_classes=3, in_channels=1, image_size=6, name_or_path=str(gpt2)).eval()
    assert model.causal and model.net.config.pad_token_id == model.net.config.eos_token_id
    x = torch.tensor([[5, 6, 7, 8, 4, 3], [9, 3, 2, 5, 4, 1]])
    direct = _direct(transformers.GPT2ForSequenceClassification, gpt2, model.net)
    with torch.no_grad():
        torch.testing.assert_close(model(x), direct(input_ids=x, attention_mask=torch.ones_like(x)).logits)


def test_a_peft_adapter_is_merged_into_the_weights(bert, tmp_path):
    base = transformers.BertForSequenceClassification.from_pretrained(bert)
    lora = peft.get_peft_model(base, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["query"]))
    torch.manual_seed(1)
    layer = lora.base_model.model.bert.encoder.layer[0].attention.self.query
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()  # B starts at zero: make the adapter do something
    a, b = layer.lora_A["default"].weight.clone(), layer.lora_B["default"].weight.clone()
    lora.save_pretrained(tmp_path / "adapter")
    model = HFModel(num_classes=5, in_channels=1, image_size=8, name_or_path=str(bert), peft=str(tmp_path / "adapter"))
    original = transformers.BertForSequenceClassification.from_pretrained(bert).bert.encoder.layer[0]
    want = original.attention.self.query.weight + (4 / 2) * b @ a  # W + (alpha / r) B A
    torch.testing.assert_close(model.net.bert.encoder.layer[0].attention.self.query.weight, want)
    assert not any("lora" in n for n, _ in model.named_parameters())  # one plain model


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_bert_classifies_a_jsonl_file_with_its_own_tokenizer_in_both_engines(bert, tmp_path):
    write_records(tmp_path / "d.jsonl", per_class=12)
    data = jsonl(path=str(tmp_path / "d.jsonl"), tokenizer=str(bert), max_length=10)
    ids = _tokenizer()("why what who 0\nextra open_qa", truncation=True, max_length=10, padding="max_length")
    assert ids["input_ids"] in torch.cat([data.train_x, data.test_x]).tolist()  # the tokenizer's ids, padded by it
    rows = {}
    for engine in ("sequential", "parallel"):
        summary = run_experiment(["dataset=jsonl", f"dataset.path={tmp_path / 'd.jsonl'}", "dataset.max_length=10",
                                  "model=hf", f"model.name_or_path={bert}", "rounds=2", "num_clients=3",
                                  "partition=iid", "device=cpu", f"engine={engine}"], tmp_path / engine)
        assert summary["status"] == "completed"
        assert summary["config"]["dataset"]["tokenizer"] == str(bert)  # follows model.name_or_path
        rows[engine] = _rows(tmp_path / engine / "metrics.csv")
    for s, p in zip(rows["sequential"], rows["parallel"]):
        assert abs(float(s["train_loss"]) - float(p["train_loss"])) < 1e-4
    assert float(rows["sequential"][1]["update_norm"]) > 0


def test_a_vision_checkpoint_classifies_the_digits(tmp_path):
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3, num_labels=2, **SMALL)
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path / "vit")
    model = HFModel(num_classes=10, in_channels=1, image_size=8, name_or_path=str(tmp_path / "vit"))
    assert model.task == "image_classification" and model.input_shape == (3, 8, 8)
    rows = {}
    for engine in ("sequential", "parallel"):
        summary = run_experiment(["model=hf", f"model.name_or_path={tmp_path / 'vit'}", "rounds=1", "num_clients=2",
                                  "device=cpu", f"engine={engine}"], tmp_path / engine)
        assert summary["status"] == "completed"
        rows[engine] = _rows(tmp_path / engine / "metrics.csv")
    assert abs(float(rows["sequential"][0]["train_loss"]) - float(rows["parallel"][0]["train_loss"])) < 1e-4


def test_an_unreachable_hub_name_is_one_line(tmp_path):
    said = (r"^model.name_or_path='fedagg-tests/no-such-model' is not a local folder nor in the Hugging Face cache "
            r"\(this machine is offline: HF_HUB_OFFLINE is set\)")
    with pytest.raises(ValueError, match=said):
        HFModel(num_classes=3, in_channels=1, image_size=8, name_or_path="fedagg-tests/no-such-model")


@pytest.mark.slow  # a command-line subprocess that imports transformers: 15-35 s
def test_the_command_line_says_the_hub_name_is_unreachable_in_one_line(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-m", "fedagg.run", "model=hf",
                          "model.name_or_path=fedagg-tests/no-such-model",
                          "rounds=1", f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True,
                         env=env)
    said = run.stdout + run.stderr
    assert run.returncode != 0 and "Traceback" not in said and "model.name_or_path='fedagg-tests/no-such-model'" in said
    assert not (tmp_path / "run" / "metrics.csv").exists()
