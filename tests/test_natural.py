"""Federated datasets with their own clients: Synthetic(alpha, beta)'s generator against SPEC, the LEAF
readers on small files in LEAF's JSON layout, partition=natural, the LEAF backbones, and the LSTM in
both engines."""

import math
from functools import partial

import numpy as np
import pytest
import torch

from fake_leaf import write_femnist, write_shakespeare
from fedagg.clients.client import ClientData
from fedagg.clients.trainer import LocalSGD
from fedagg.data import leaf, synthetic
from fedagg.data.datasets import DatasetBundle
from fedagg.data.device import DeviceData
from fedagg.data.natural import natural, own_test_splits, split_pool, takes_owners
from fedagg.data.partition import dirichlet
from fedagg.engines.parallel import ParallelEngine
from fedagg.engines.sequential import SequentialEngine
from fedagg.models.flat import get_buffers, get_params
from fedagg.models.leaf import CNNFemnist, LSTMLayer, LSTMShakespeare
from test_parallel_engine import TOL, _rel, _two_rounds


# --- Synthetic(alpha, beta) -----------------------------------------------------------------


def test_synthetic_generator_statistics_match_spec():
    d = synthetic.generate(30, alpha=1.0, beta=1.0, iid=False, seed=0)
    sizes = np.array([len(y) for y in d.y])
    assert sizes.min() >= 50 and sizes.max() > 4 * np.median(sizes)  # heavy-tailed sizes, 50 at least
    # W_k and b_k entries ~ N(u_k, 1): 610 draws put their mean within 4/sqrt(610) of u_k
    for k in range(30):
        assert abs(np.concatenate([d.W[k].ravel(), d.b[k]]).mean() - d.u[k]) < 4 / math.sqrt(610)
        assert abs(d.v[k].mean() - d.B[k]) < 4 / math.sqrt(60)  # v_k entries ~ N(B_k, 1)
    assert d.u.std() > 0.5 and d.B.std() > 0.5  # alpha = beta = 1: devices differ
    # x ~ N(v_k, Sigma), Sigma diagonal with Sigma_jj = j^-1.2: pooled over devices around their own means
    centred = np.concatenate([x - v for x, v in zip(d.x, d.v)])
    var = centred.var(axis=0)
    np.testing.assert_allclose(var, np.arange(1, 61) ** -1.2, rtol=0.1)  # ~2% sampling error on >9,000 rows
    corr = np.corrcoef(centred[:, :5].T)
    assert np.abs(corr - np.eye(5)).max() < 0.05  # no covariance off the diagonal
    for k in (0, 7):  # y = argmax(W_k x + b_k)
        np.testing.assert_array_equal(d.y[k], np.argmax(d.x[k] @ d.W[k].T + d.b[k], axis=1))


def test_synthetic_iid_and_zero_alpha():
    iid = synthetic.generate(5, alpha=1.0, beta=1.0, iid=True, seed=0)
    assert (iid.W == iid.W[0]).all() and (iid.b == iid.b[0]).all() and (iid.v == 0).all()
    flat = synthetic.generate(5, alpha=0.0, beta=0.0, iid=False, seed=0)
    assert (flat.u == 0).all() and (flat.B == 0).all()


def test_synthetic_bundle_keeps_each_device_split_90_10_and_its_own_seed():
    b = synthetic.synthetic(num_devices=6, seed=3)
    d = synthetic.generate(6, 1.0, 1.0, False, seed=3)
    assert b.train_x.shape[1:] == (60, 1, 1) and b.inputs == "vectors" and b.num_classes == 10
    for k, y in enumerate(d.y):
        n_train, n_test = int((b.train_owner == k).sum()), int((b.test_owner == k).sum())
        assert (n_train, n_test) == (int(0.9 * len(y)), len(y) - int(0.9 * len(y)))
        rows = torch.cat([b.train_x[b.train_owner == k], b.test_x[b.test_owner == k]]).view(-1, 60).double()
        drawn = torch.from_numpy(d.x[k]).float().double()
        assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, drawn.tolist()))  # the device's own samples
    again, other = synthetic.synthetic(num_devices=6, seed=3), synthetic.synthetic(num_devices=6, seed=4)
    assert torch.equal(again.train_x, b.train_x) and not torch.equal(other.train_y[:50], b.train_y[:50])
    with pytest.raises(ValueError, match=r"^dataset.alpha=-1.0 is not allowed; it must be a number >= 0"):
        synthetic.synthetic(alpha=-1.0)


# --- partition=natural ------------------------------------------------------------------------


OWNERS = torch.tensor([2, 0, 1, 2, 2, 0, 3, 1, 3, 3, 4])


def test_natural_partition_gives_whole_clients_a_seeded_sample():
    labels = torch.zeros(len(OWNERS), dtype=torch.long)
    every = natural(labels, 5, generator=torch.Generator().manual_seed(0), owners=OWNERS)
    assert [p.tolist() for p in every] == [[1, 5], [2, 7], [0, 3, 4], [6, 8, 9], [10]]
    picks = [natural(labels, 3, generator=torch.Generator().manual_seed(s), owners=OWNERS) for s in (0, 0, 1, 2, 3)]
    assert [p.tolist() for p in picks[0]] == [p.tolist() for p in picks[1]]  # same seed, same sample
    assert len({tuple(int(OWNERS[p[0]]) for p in split) for split in picks}) > 1  # other seeds, other samples
    for split in picks:
        owners = [OWNERS[p].unique().tolist() for p in split]
        assert all(len(o) == 1 for o in owners) and owners == sorted(owners)  # whole clients, in dataset order
        assert all(int((OWNERS == o[0]).sum()) == p.numel() for o, p in zip(owners, split))
        assert len(torch.cat(split).unique()) == sum(p.numel() for p in split)  # disjoint
    with pytest.raises(ValueError, match=r"^num_clients=6 is not allowed with partition=natural: the dataset has 5 "):
        natural(labels, 6, generator=torch.Generator(), owners=OWNERS)
    with pytest.raises(ValueError, match=r"^partition=natural needs a dataset with its own clients"):
        natural(labels, 2, generator=torch.Generator())


def test_split_pool_passes_owners_only_to_a_partition_that_takes_them():
    labels = torch.arange(len(OWNERS)) % 2
    label_split = partial(dirichlet, min_size=1)  # what Hydra's _partial_ hands over
    assert takes_owners(partial(natural)) and not takes_owners(label_split)
    parts = split_pool(label_split, labels, 2, torch.Generator().manual_seed(0), OWNERS)  # a label split pools them
    assert sorted(torch.cat(parts).tolist()) == list(range(len(OWNERS)))


def test_own_test_splits_belong_to_the_same_client():
    test_owner = torch.tensor([3, 0, 3, 4, 0, 3])
    assert [t.tolist() for t in own_test_splits([3, 0, 4, 1], test_owner)] == [[0, 2, 5], [1, 4], [3], []]


# --- LEAF files -------------------------------------------------------------------------------


def test_femnist_reads_leaf_json_and_splits_each_writer_90_10(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache"))
    writers = write_femnist(tmp_path, sizes=((5, 12, 1), (3, 2)))
    b = leaf.femnist(str(tmp_path), mean=[0.0], std=[1.0])
    kept = [w for w in writers if len(w["y"]) >= 2]  # a writer of one sample has no train/test split
    assert b.num_classes == 62 and b.train_x.shape[1:] == (1, 28, 28) and int(b.train_owner.max()) == len(kept) - 1
    for k, w in enumerate(kept):
        n = len(w["y"])
        tr, te = b.train_owner == k, b.test_owner == k
        assert (int(tr.sum()), int(te.sum())) == ((1, 1) if n == 2 else (int(0.9 * n), n - int(0.9 * n)))
        images = torch.cat([b.train_x[tr], b.test_x[te]])
        labels = torch.cat([b.train_y[tr], b.test_y[te]])
        order = sorted(range(n), key=lambda i: images[i].flatten().tolist())
        expected = sorted(range(n), key=lambda i: w["x"][i].flatten().tolist())
        assert torch.equal(images[order], torch.from_numpy(w["x"][expected]))  # its own images, exactly
        assert labels[order].tolist() == w["y"][expected].tolist()
    cached = list((tmp_path / "cache").glob("femnist-leaf-*.pt"))
    assert len(cached) == 1 and torch.equal(leaf.femnist(str(tmp_path), mean=[0.0], std=[1.0]).test_x, b.test_x)


def test_shakespeare_reads_leaf_json_and_splits_each_role_80_20_in_time_order(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache"))
    roles = write_shakespeare(tmp_path, sizes=(6, 11, 2))
    b = leaf.shakespeare(str(tmp_path))
    assert b.inputs == "tokens" and b.num_classes == 80 and b.image_size == 80
    for k, tokens in enumerate(roles):
        cut = 1 if len(tokens) == 2 else int(0.8 * len(tokens))
        assert torch.equal(b.train_x[b.train_owner == k], torch.from_numpy(tokens[:cut]))  # the earliest lines
        assert torch.equal(b.test_x[b.test_owner == k], torch.from_numpy(tokens[cut:]))
    assert torch.equal(b.train_y, b.train_x[:, -1].long())


def test_missing_leaf_files_say_what_to_put_where(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^shakespeare not found: no such folder in .*shakespeare/all_data\n"):
        leaf.shakespeare(str(tmp_path))


# --- backbones --------------------------------------------------------------------------------


def test_cnn_femnist_has_leafs_parameter_count():
    model = CNNFemnist(num_classes=62, in_channels=1, image_size=28)
    assert sum(p.numel() for p in model.parameters()) == 6_603_710
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 62)


def test_lstm_layers_compute_what_nn_lstm_does():
    torch.manual_seed(0)
    model = LSTMShakespeare(num_classes=80, in_channels=1, image_size=12, hidden=16)
    ref = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True)
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            for mine, theirs in ((layer.ih, "ih"), (layer.hh, "hh")):
                getattr(ref, f"weight_{theirs}_l{i}").copy_(mine.weight)
                getattr(ref, f"bias_{theirs}_l{i}").copy_(mine.bias)
    tokens = torch.randint(0, 80, (3, 12))
    logits = model(tokens)
    assert logits.shape == (3, 12, 80)
    torch.testing.assert_close(logits, model.out(ref(model.embed(tokens))[0]), rtol=1e-5, atol=1e-6)
    assert isinstance(model.layers[1], LSTMLayer) and model.layers[1].ih.in_features == 16


def test_lstm_round_in_the_parallel_engine_matches_the_sequential_one():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 80, (60, 11), dtype=torch.uint8, generator=g)
    bundle = DatasetBundle("toy", x, x[:, -1].long(), x, x[:, -1].long(), 80, (0.0,), (1.0,), False, inputs="tokens")
    torch.manual_seed(0)
    model = LSTMShakespeare(num_classes=80, in_channels=1, image_size=10, hidden=12)
    data = DeviceData(bundle, torch.device("cpu"), model.input_shape)
    perm = torch.randperm(60, generator=g)
    clients = [ClientData(5 + i, perm[a:b], perm[b:b + 3]) for i, (a, b) in enumerate([(0, 9), (12, 33), (36, 50)])]
    kw = dict(lr=0.5, momentum=0.9, batch_size=4, local_epochs=1, keep_optimizer_state=True)
    start = get_params(model), get_buffers(model)
    ref = _two_rounds(SequentialEngine(), model, start, data, clients, LocalSGD(**kw), kw["lr"])
    par = _two_rounds(ParallelEngine(chunk_size=2), model, start, data, clients, LocalSGD(**kw), kw["lr"])
    for s, p in zip(ref, par):
        assert _rel(s.params[0], start[0]) > 1e-3  # it trained
        for k in range(len(clients)):
            assert _rel(p.params[k], s.params[k]) < TOL
        torch.testing.assert_close(p.train_loss, s.train_loss, rtol=TOL, atol=TOL)
        torch.testing.assert_close(p.val_acc, s.val_acc)
        assert ((s.val_acc * 30) - (s.val_acc * 30).round()).abs().max() < 1e-4  # a share of 3 x 10 positions


def test_synthetic_device_sizes_for_many_small_clients():
    """size_mean=0 size_sigma=0: floor(lognormal(0, 0)) = 1, so every device holds min_size + 1 samples."""
    b = synthetic.synthetic(num_devices=50, size_mean=0.0, size_sigma=0.0, min_size=9)
    assert torch.bincount(b.train_owner).tolist() == [9] * 50 and torch.bincount(b.test_owner).tolist() == [1] * 50
    assert synthetic.synthetic(num_devices=3, min_size=2, size_mean=0.0, size_sigma=0.0).train_y.numel() == 6
    default = synthetic.synthetic(num_devices=4, seed=1)
    explicit = synthetic.synthetic(num_devices=4, seed=1, size_mean=4.0, size_sigma=2.0, min_size=50)
    assert torch.equal(default.train_x, explicit.train_x)  # the defaults are FedProx's sizes


@pytest.mark.parametrize("key,value,allowed", [("min_size", 1, "integer >= 2"), ("size_mean", -1.0, "in \\[0, 20\\]"),
                                               ("size_sigma", 21, "in \\[0, 20\\]"), ("min_size", 2.5, "integer >= 2")])
def test_synthetic_size_keys_refused_in_one_line(key, value, allowed):
    with pytest.raises(ValueError, match=f"dataset.{key}=.* is not allowed; it must be .*{allowed}"):
        synthetic.synthetic(num_devices=3, **{key: value})
