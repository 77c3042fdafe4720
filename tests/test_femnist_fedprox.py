"""`dataset=femnist_fedprox`: FedProx's own 10-letter, 200-device FEMNIST (litian96/FedProx@d2a4501
data/nist/data/my_sample.py), on fake LEAF files and fake label vectors."""

import json

import numpy as np
import pytest
import torch

from conftest import compose_config
from fedagg.data.femnist_fedprox import fedprox_devices, femnist_fedprox
from fedagg.data.files import DataError
from fedagg.seeding import stream_seed
from fedagg.run import train


def _their_counts(num_devices, classes, seed=0):
    """my_sample.py:75-90 in our words: n_u = lognormal(4, 1) + 5 (the stream's first draw), then
    max(2, int(n_u / C)) images of each letter (u + j) % 10, j < C. {device: {letter: count}}."""
    n = np.random.default_rng(stream_seed(seed, "femnist_fedprox")).lognormal(4.0, 1.0, num_devices) + 5
    return {u: {(u + j) % 10: max(2, int(n[u] / classes)) for j in range(classes)} for u in range(num_devices)}


@pytest.mark.parametrize("classes", [3, 5])  # the code's 3 (my_sample.py:13), the text's 5 (App. C.1)
def test_two_hundred_devices_of_a_few_lowercase_letters_with_lognormal_sizes(classes):
    labels = np.repeat(np.arange(62), 4500)  # every LEAF class, more than the 4,000 a letter keeps
    devices = fedprox_devices(labels, classes_per_device=classes)
    assert len(devices) == 200
    rows = np.concatenate(devices)
    assert len(np.unique(rows)) == len(rows)  # disjoint: no image on two devices
    assert set(np.unique(labels[rows]).tolist()) == set(range(36, 46))  # 'a'..'j' only, all ten used
    expected = _their_counts(200, classes)
    for u, d in enumerate(devices):
        letters, counts = np.unique(labels[d] - 36, return_counts=True)
        assert dict(zip(letters.tolist(), counts.tolist())) == expected[u]
        assert len(letters) == classes and counts.min() >= 2
    total = sum(sum(c.values()) for c in expected.values())
    assert len(rows) == total == {3: 20085, 5: 19920}[classes]  # this stream's draw; the paper's was 18,345
    for c in range(36, 46):  # each letter is read from a shuffled pool of its images, not in file order
        used = rows[labels[rows] == c]
        assert not np.array_equal(np.sort(used), np.flatnonzero(labels == c)[: len(used)])


def test_a_letter_that_runs_out_is_an_error_not_a_reuse():
    labels = np.repeat(np.arange(62), 40)
    taken, short = [0] * 10, None
    for u, counts in _their_counts(200, 3).items():  # the first device whose letter has fewer than 40 left
        for c, n in counts.items():
            if short is None and taken[c] + n > 40:
                short = f"letter '{'abcdefghij'[c]}' has 40 images in the files read; device {u} needs images " \
                        f"{taken[c] + 1}..{taken[c] + n}"
            taken[c] += n
    with pytest.raises(DataError, match=f"femnist_fedprox: {short}"):
        fedprox_devices(labels, num_devices=200)


def _write_leaf(root, per_label):
    """LEAF all_data JSON whose images carry their own label (pixel 0) and a serial number (pixels 1, 2)."""
    users, serial = {}, 0
    for w, counts in enumerate(per_label):
        xs, ys = [], []
        for label, n in counts.items():
            for _ in range(n):
                pixels = [0] * 784
                pixels[0], pixels[1], pixels[2] = label / 255, (serial // 256) / 255, (serial % 256) / 255
                xs.append(pixels)
                ys.append(label)
                serial += 1
        users[f"w{w:03d}"] = {"x": xs, "y": ys}
    folder = root / "femnist" / "all_data"
    folder.mkdir(parents=True)
    (folder / "all_data_0.json").write_text(json.dumps({"users": list(users), "user_data": users}))
    return serial


def test_the_bundle_relabels_the_letters_and_cuts_each_device_90_10(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache"))
    # three writers: digits, letters a-j (150 each, enough for six devices), and uppercase letters
    serials = _write_leaf(tmp_path, [{3: 20, 7: 5}, {c: 150 for c in range(36, 46)}, {12: 30}])
    b = femnist_fedprox(str(tmp_path), mean=[0.0], std=[1.0], num_devices=6)
    assert b.num_classes == 10 and b.train_x.shape[1:] == (1, 28, 28)
    for split in ("train", "test"):
        x, y = getattr(b, f"{split}_x"), getattr(b, f"{split}_y")
        assert torch.equal(x[:, 0, 0, 0].long(), y + 36)  # each image's own letter, relabelled a..j -> 0..9
    ids = torch.cat([b.train_x, b.test_x])[:, 0, 0, 1:3].long()
    ids = ids[:, 0] * 256 + ids[:, 1]
    assert len(ids.unique()) == len(ids) and int(ids.max()) < serials
    expected = _their_counts(6, 3)
    for u in range(6):
        n = sum(expected[u].values())
        tr, te = b.train_owner == u, b.test_owner == u
        assert (int(tr.sum()), int(te.sum())) == (int(0.9 * n), n - int(0.9 * n))
        labels, counts = torch.cat([b.train_y[tr], b.test_y[te]]).unique(return_counts=True)
        assert dict(zip(labels.tolist(), counts.tolist())) == expected[u]


def test_it_composes_with_its_devices_as_clients_and_refuses_bad_values(tmp_path):
    cfg = compose_config("dataset=femnist_fedprox")
    assert cfg.partition._target_.endswith(".natural") and cfg.dataset.default_model == "mlr"
    assert (cfg.dataset.num_devices, cfg.dataset.classes_per_device, cfg.dataset.train_frac) == (200, 3, 0.9)
    with pytest.raises(ValueError, match=r"dataset.classes_per_device=11 is not allowed; it must be an integer in 1..10"):
        train(compose_config("dataset=femnist_fedprox", "dataset.classes_per_device=11", "device=cpu"), tmp_path / "a")
    with pytest.raises(ValueError, match=r"dataset.num_devices=0 is not allowed"):
        femnist_fedprox(str(tmp_path), mean=[0.0], std=[1.0], num_devices=0)


def test_mlr_trains_on_it_with_ten_outputs(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache"))
    _write_leaf(tmp_path / "data", [{c: 150 for c in range(36, 46)}])
    summary = train(compose_config("dataset=femnist_fedprox", "dataset.num_devices=6", "num_clients=null", "rounds=1",
                                   "device=cpu", f"data.root={tmp_path / 'data'}"), tmp_path / "run")
    assert summary["status"] == "completed"
    weights = torch.load(tmp_path / "run" / "model.pt")
    assert [tuple(w.shape) for w in weights.values()] == [(10, 784), (10,)]
    clients = json.loads((tmp_path / "run" / "partition.json").read_text())["clients"]
    assert len(clients) == 6
