"""fedagg's own transformers (vit_tiny, char_decoder, text_decoder): their arithmetic against torch's own
layers, the two engines against each other (tests/test_parallel_engine.py's pattern and tolerance), and the
base files of model.pretrained."""

import csv
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedagg.clients.client import ClientData
from fedagg.clients.trainer import LocalSGD
from fedagg.data.device import DeviceData
from fedagg.engines.base import RoundJob
from fedagg.engines.parallel import ParallelEngine
from fedagg.engines.sequential import SequentialEngine
from fedagg.models.decoder import Decoder
from fedagg.models.flat import get_buffers, get_params
from fedagg.models.pretrained import save_base
from fedagg.models.transformer import Attention
from fedagg.models.vit import ViT
from fedagg.run import run_experiment

TOL = 1e-4  # tests/test_parallel_engine.py's


def test_attention_is_multihead_attention_with_the_same_weights():
    torch.manual_seed(0)
    attn, mha = Attention(12, 3, causal=True), nn.MultiheadAttention(12, 3, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([attn.q.weight, attn.k.weight, attn.v.weight]))
        mha.in_proj_bias.copy_(torch.cat([attn.q.bias, attn.k.bias, attn.v.bias]))
        mha.out_proj.weight.copy_(attn.o.weight)
        mha.out_proj.bias.copy_(attn.o.bias)
    x = torch.randn(2, 5, 12)
    mask = torch.ones(5, 5, dtype=torch.bool).triu(1)  # True: may not attend
    torch.testing.assert_close(attn(x), mha(x, x, x, attn_mask=mask, need_weights=False)[0])
    attn.causal = False
    torch.testing.assert_close(attn(x), mha(x, x, x, need_weights=False)[0])


def test_decoder_position_never_sees_later_tokens():
    torch.manual_seed(0)
    model = Decoder(num_classes=20, in_channels=1, image_size=6, dim=16, depth=2, heads=2)
    a = torch.randint(0, 20, (3, 6))
    b = a.clone()
    b[:, 4:] = (a[:, 4:] + 1) % 20
    la, lb = model(a), model(b)
    assert la.shape == (3, 6, 20)
    torch.testing.assert_close(la[:, :4], lb[:, :4])  # positions 0..3 read only tokens 0..3
    assert (la[:, 4:] - lb[:, 4:]).abs().max() > 1e-3


def test_text_decoder_classifies_from_the_last_position():
    torch.manual_seed(0)
    model = Decoder(num_classes=3, in_channels=1, image_size=7, head="last", vocab_size=256, dim=16, depth=1,
                    heads=2)
    x = torch.randint(0, 256, (4, 7))
    lm = model.out(model.norm(_blocks(model, x)))  # every position's logits, by hand
    torch.testing.assert_close(model(x), lm[:, -1])
    assert model.embed.num_embeddings == 256 and model(x).shape == (4, 3)


def _blocks(model, x):
    h = model.embed(x) + model.pos
    for block in model.blocks:
        h = block(h)
    return h


def test_vit_patch_embedding_is_a_strided_convolution():
    torch.manual_seed(0)
    model = ViT(num_classes=10, in_channels=3, image_size=12, patch_size=4, dim=8, depth=1, heads=2)
    x = torch.randn(2, 3, 12, 12)
    conv = F.conv2d(x, model.embed.weight.view(8, 3, 4, 4), model.embed.bias, stride=4)  # [2, 8, 3, 3]
    torch.testing.assert_close(model.embed(model.patches(x)), conv.flatten(2).transpose(1, 2))


def test_vit_parameter_count_and_input_size():
    # patches 7x7=49 of 1x4x4; per block 4 (64x64+64) + 2 LayerNorms + fc1 64->128 + fc2 128->64
    model = ViT(num_classes=10, in_channels=1, image_size=28)
    block = 4 * (64 * 64 + 64) + 2 * 2 * 64 + (64 * 128 + 128) + (128 * 64 + 64)
    expected = (16 * 64 + 64) + 64 + 50 * 64 + 4 * block + 2 * 64 + (64 * 10 + 10)
    assert sum(p.numel() for p in model.parameters()) == expected
    assert model.input_shape == (1, 28, 28)
    assert ViT(num_classes=10, in_channels=3, image_size=8, input_size=32).input_shape == (3, 32, 32)
    with pytest.raises(ValueError, match=r"model.patch_size=5 is not allowed on 28x28"):
        ViT(num_classes=10, in_channels=1, image_size=28, patch_size=5)
    with pytest.raises(ValueError, match=r"model.dim=30 is not allowed with model.heads=4"):
        ViT(num_classes=10, in_channels=1, image_size=28, dim=30)


def _bundle(kind, n, g):
    if kind == "images":
        x = torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8, generator=g)
        y = torch.randint(0, 10, (n,), generator=g)
        return SimpleNamespace(name="toy", num_classes=10, augment=False, train_x=x, train_y=y, test_x=x, test_y=y,
                               mean=(0.5,), std=(0.25,))
    x = torch.randint(0, 12, (n, 9), dtype=torch.uint8, generator=g)  # 8 tokens read, the 9th predicted
    return SimpleNamespace(name="toy", num_classes=12, augment=False, train_x=x, train_y=x[:, -1].long(),
                           test_x=x, test_y=x[:, -1].long(), mean=(0.0,), std=(1.0,), inputs="tokens")


CASES = {  # model factory, data kind
    "vit": (lambda: ViT(num_classes=10, in_channels=1, image_size=8, patch_size=2, dim=16, depth=2, heads=2), "images"),
    "char_decoder": (lambda: Decoder(num_classes=12, in_channels=1, image_size=8, dim=16, depth=2, heads=2), "tokens"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_engines_agree_on_the_transformers(case):
    factory, kind = CASES[case]
    g = torch.Generator().manual_seed(0)
    sizes = [7, 13, 10]
    bundle = _bundle(kind, sum(sizes) + 2 * len(sizes), g)
    torch.manual_seed(0)
    model = factory()
    data = DeviceData(bundle, torch.device("cpu"), model.input_shape)
    perm, clients, offset = torch.randperm(len(bundle.train_y), generator=g), [], 0
    for cid, k in enumerate(sizes):
        clients.append(ClientData(cid, perm[offset: offset + k], perm[offset + k: offset + k + 2]))
        offset += k + 2
    start = get_params(model), get_buffers(model)
    results = []
    for engine in (SequentialEngine(), ParallelEngine(chunk_size=2)):
        trainer = LocalSGD(lr=0.1, momentum=0.9, batch_size=4, local_epochs=2, keep_optimizer_state=True)
        results.append([engine.train_round(RoundJob(model, trainer, data, clients, start[0].clone(), start[1].clone(),
                                                    lr=0.1, seed=3, round=r, val_indices=[c.val_idx for c in clients]))
                        for r in (1, 2)])
    for s, p in zip(*results):
        for k in range(len(clients)):
            assert float((p.params[k] - s.params[k]).norm() / s.params[k].norm()) < TOL
        assert (s.params[0] - start[0]).norm() > 100 * TOL * start[0].norm()  # the clients did move
        torch.testing.assert_close(p.train_loss, s.train_loss, rtol=TOL, atol=TOL)


def _vit(seed, **kw):
    torch.manual_seed(seed)
    return ViT(**{"num_classes": 10, "in_channels": 1, "image_size": 8, "patch_size": 2, "dim": 16, "depth": 1,
                  "heads": 2, **kw})


def test_a_base_file_loads_into_the_same_architecture(tmp_path):
    base = _vit(0)
    path = save_base(base, tmp_path / "vit.pt", {"dataset": "toy"})
    loaded = _vit(1, pretrained=str(path))
    assert all(torch.equal(a, b) for a, b in zip(base.state_dict().values(), loaded.state_dict().values()))
    fresh, other = _vit(2), _vit(2, num_classes=5, pretrained=str(path))  # other classes: the body only
    assert torch.equal(other.head.weight, _vit(2, num_classes=5).head.weight)  # the run's own fresh head
    assert torch.equal(other.blocks[0].attn.q.weight, base.blocks[0].attn.q.weight)
    assert not torch.equal(fresh.blocks[0].attn.q.weight, base.blocks[0].attn.q.weight)


def test_a_base_of_another_architecture_or_no_file_is_one_line(tmp_path):
    path = save_base(_vit(0), tmp_path / "vit.pt", {})
    with pytest.raises(ValueError, match=r"model.dim=32 \(the base has 16\); set those keys"):
        _vit(0, dim=32, pretrained=str(path))
    with pytest.raises(ValueError, match=r"holds a ViT, not the Decoder"):
        Decoder(num_classes=10, in_channels=1, image_size=8, pretrained=str(path))
    with pytest.raises(ValueError, match=r"model.pretrained='.*missing.pt': no such file; make one with"):
        _vit(0, pretrained=str(tmp_path / "missing.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"is not a readable base file"):
        _vit(0, pretrained=str(tmp_path / "junk.pt"))


def _metrics(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_vit_runs_on_the_digits_in_both_engines(tmp_path):
    rows = {}
    for engine in ("sequential", "parallel"):
        summary = run_experiment(["model=vit_tiny", "model.patch_size=2", "model.dim=16", "model.depth=1",
                                  "rounds=2", "num_clients=3", "device=cpu", f"engine={engine}"], tmp_path / engine)
        assert summary["status"] == "completed" and summary["choices"]["model"] == "vit_tiny"
        assert summary["config"]["model"]["patch_size"] == 2
        rows[engine] = _metrics(tmp_path / engine / "metrics.csv")
    for s, p in zip(rows["sequential"], rows["parallel"]):  # the same clients, batches and start
        assert abs(float(s["train_loss"]) - float(p["train_loss"])) < TOL
        assert abs(float(s["test_loss"]) - float(p["test_loss"])) < TOL
    assert len(rows["parallel"]) == 2 and float(rows["sequential"][1]["update_norm"]) > 0


@pytest.mark.parametrize("channels, side, input_size", [(1, 8, None), (1, 28, None), (3, 32, None), (1, 8, 28)])
def test_vit_takes_each_image_dataset_shape(channels, side, input_size):
    """digits 1x8x8, MNIST 1x28x28, CIFAR 3x32x32, and digits resized to 28 by the data pipeline."""
    bundle = SimpleNamespace(name="toy", num_classes=10, augment=False, mean=(0.5,) * channels, std=(0.25,) * channels,
                             train_x=torch.zeros(3, channels, side, side, dtype=torch.uint8),
                             train_y=torch.zeros(3, dtype=torch.long))
    bundle.test_x, bundle.test_y = bundle.train_x, bundle.train_y
    model = ViT(num_classes=10, in_channels=channels, image_size=side, input_size=input_size, dim=16, depth=1, heads=2)
    x, _ = DeviceData(bundle, torch.device("cpu"), model.input_shape).train_batch(torch.arange(3))
    grid = (input_size or side) // 4
    assert model(x).shape == (3, 10) and model.pos.shape == (1, grid * grid + 1, 16)


def test_char_decoder_runs_shakespeare_from_leaf_files(tmp_path, monkeypatch):
    from fake_leaf import write_shakespeare

    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache"))
    write_shakespeare(tmp_path / "data", sizes=(10, 16, 7))
    rows = {}
    for engine in ("sequential", "parallel"):
        summary = run_experiment(["dataset=shakespeare", f"data.root={tmp_path / 'data'}", "model=char_decoder",
                                  "model.dim=16", "model.depth=1", "num_clients=null", "client.batch_size=4",
                                  "rounds=2", "device=cpu", f"engine={engine}"], tmp_path / engine)
        assert summary["status"] == "completed" and summary["choices"]["model"] == "char_decoder"
        rows[engine] = _metrics(tmp_path / engine / "metrics.csv")
    for s, p in zip(rows["sequential"], rows["parallel"]):
        assert abs(float(s["train_loss"]) - float(p["train_loss"])) < TOL
