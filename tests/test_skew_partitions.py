"""quantity_skew, feature_skew (partition.noise on any split) and pachinko: exact properties."""

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedagg.clients.client import ClientData
from fedagg.clients.trainer import LocalSGD
from fedagg.data.device import DeviceData
from fedagg.data.skew_partitions import CIFAR100_COARSE, feature_skew, pachinko, quantity_skew
from fedagg.engines.base import RoundJob
from fedagg.engines.parallel import ParallelEngine
from fedagg.engines.sequential import SequentialEngine
from fedagg.models.cnns import CNNSmall
from fedagg.models.flat import get_buffers, get_params


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _disjoint_cover(parts, n, everything=True):
    flat = torch.cat(parts)
    assert flat.unique().numel() == flat.numel()  # disjoint
    if everything:
        assert sorted(flat.tolist()) == list(range(n))


def test_quantity_skew_cuts_one_shuffled_pool_at_dirichlet_shares():
    labels = torch.arange(10).repeat(100)  # 1,000 samples
    parts = quantity_skew(labels, 8, generator=_g(3), beta=0.5, min_size=10)
    _disjoint_cover(parts, 1000)
    sizes = [len(p) for p in parts]
    assert min(sizes) >= 10 and max(sizes) > 2 * min(sizes)  # skewed sizes
    # the shares are the pool's consecutive pieces: the same draws by hand give the same cut points
    g = _g(3)
    perm = torch.randperm(1000, generator=g)
    rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=g)))
    while True:
        q = rng.dirichlet(np.full(8, 0.5))
        cuts = np.round(np.cumsum(q)[:-1] * 1000).astype(int)
        if np.diff(cuts, prepend=0, append=1000).min() >= 10:
            break
    assert [p.tolist() for p in parts] == [p.tolist() for p in perm.tensor_split(cuts.tolist())]
    assert [p.tolist() for p in quantity_skew(labels, 8, generator=_g(3))] == [p.tolist() for p in parts]


def test_quantity_skew_that_cannot_be_met_is_one_line():
    with pytest.raises(ValueError) as err:
        quantity_skew(torch.zeros(100, dtype=torch.long), 10, generator=_g(), beta=0.01, min_size=10, max_retries=3)
    assert str(err.value).startswith("quantity_skew split failed: in partition.max_retries=3 draws with "
                                     "partition.beta=0.01 and num_clients=10, no draw gave every client 10 samples")
    with pytest.raises(ValueError, match=r"^partition\.beta=0 is not allowed: it must be a finite number greater than 0"):
        quantity_skew(torch.zeros(100, dtype=torch.long), 10, generator=_g(), beta=0)


def test_feature_skew_is_an_iid_split():
    labels = torch.arange(10).repeat(7)
    parts = feature_skew(labels, 4, generator=_g(1), noise=0.3)
    _disjoint_cover(parts, 70)
    assert sorted(len(p) for p in parts) == [17, 17, 18, 18]


def _bundle(n, channels=1, size=8, value=128, augment=False):
    x = torch.full((n, channels, size, size), value, dtype=torch.uint8)
    y = torch.arange(n) % 10
    return SimpleNamespace(name="toy", num_classes=10, augment=augment, train_x=x, train_y=y, test_x=x, test_y=y,
                           mean=(0.5,) * channels, std=(0.25,) * channels)


def test_feature_noise_has_each_clients_sigma_in_the_normalised_space_and_is_drawn_once():
    data = DeviceData(_bundle(2000), torch.device("cpu"), (1, 8, 8))
    parts = list(torch.randperm(2000, generator=_g()).split(500))
    clean = [data.prepare(data.train_x[p]) for p in parts]
    data.add_feature_noise(parts, 0.8, seed=0)
    measured = [float((data.prepare(data.train_images(p)) - c).std()) for p, c in zip(parts, clean)]
    # client i of N = 4: sigma * i / N = 0, 0.2, 0.4, 0.6, each measured on 32,000 values (sd error ~0.4%)
    assert measured[0] == 0.0
    np.testing.assert_allclose(measured[1:], [0.2, 0.4, 0.6], rtol=0.02)
    mean = [float((data.prepare(data.train_images(p)) - c).mean()) for p, c in zip(parts, clean)]
    np.testing.assert_allclose(mean, 0.0, atol=0.01)
    again = data.train_images(parts[3])
    assert torch.equal(again, data.train_images(parts[3]))  # the same image looks the same every time
    # drawn from client 3's own stream: another client's indices change nothing of it
    other = DeviceData(_bundle(2000), torch.device("cpu"), (1, 8, 8))
    other.add_feature_noise([parts[0], parts[2], parts[1], parts[3]], 0.8, seed=0)
    assert torch.equal(other.train_images(parts[3]), again)


def test_feature_noise_trains_alike_in_both_engines():
    g = _g(0)
    n = 72
    bundle = _bundle(n, size=28, augment=True)
    bundle.train_x = torch.randint(0, 256, bundle.train_x.shape, dtype=torch.uint8, generator=g)
    torch.manual_seed(0)
    model = CNNSmall(num_classes=10, in_channels=1, image_size=28)
    start = get_params(model), get_buffers(model)
    parts = list(torch.randperm(n, generator=g).split([30, 24, 18]))
    clients = [ClientData(i, p[:-2], p[-2:]) for i, p in enumerate(parts)]

    def run(engine, noise):
        data = DeviceData(bundle, torch.device("cpu"), model.input_shape)
        if noise:
            data.add_feature_noise(parts, noise, seed=0)
        trainer = LocalSGD(lr=0.05, momentum=0.9, batch_size=8, local_epochs=1)
        return engine.train_round(RoundJob(model, trainer, data, clients, start[0].clone(), start[1].clone(), lr=0.05,
                                           seed=3, round=1, val_indices=[c.val_idx for c in clients]))

    seq, par, plain = run(SequentialEngine(), 2.0), run(ParallelEngine(), 2.0), run(SequentialEngine(), 0.0)
    torch.testing.assert_close(par.params, seq.params, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(par.train_loss, seq.train_loss, rtol=1e-4, atol=1e-5)
    # client 0 has no noise; the others' weights move by far more than the tolerance above
    torch.testing.assert_close(plain.params[0], seq.params[0], rtol=1e-5, atol=1e-6)
    assert float((plain.params[2] - seq.params[2]).norm() / seq.params[2].norm()) > 1e-3


def test_cifar100_coarse_table_has_five_fine_labels_per_coarse_label():
    assert len(CIFAR100_COARSE) == 100 and Counter(Counter(CIFAR100_COARSE).values()) == {5: 20}


def _hand_pachinko(labels, coarse_of, clients, spc, alpha, beta, seed):
    """The SPEC's Pachinko, step by step with plain lists, drawing in the documented order from the same seed."""
    g = _g(seed)
    n = len(labels)
    shuffled = torch.randperm(n, generator=g).tolist()
    pools = {f: [i for i in shuffled if labels[i] == f] for f in range(len(coarse_of))}
    rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=g)))
    coarse = sorted(set(coarse_of))
    fines = {c: [f for f in range(len(coarse_of)) if coarse_of[f] == c] for c in coarse}

    def pick(probs, alive, u):
        mass = [p if a else 0.0 for p, a in zip(probs, alive)]
        if sum(mass) == 0:
            mass = [1.0 if a else 0.0 for a in alive]
        total, acc = sum(mass), 0.0
        for j, m in enumerate(mass):  # the first label whose cumulative mass exceeds u * total
            acc += m
            if u * total < acc:
                return j
        return len(mass) - 1

    out = []
    for _ in range(clients):
        p_c = rng.dirichlet([alpha] * len(coarse))
        p_f = [rng.dirichlet([beta] * len(fines[c])) for c in coarse]
        mine = []
        for _ in range(spc):
            c = pick(p_c, [any(pools[f] for f in fines[c]) for c in coarse], rng.random())
            k = pick(p_f[c], [bool(pools[f]) for f in fines[coarse[c]]], rng.random())
            mine.append(pools[fines[coarse[c]][k]].pop(0))
        out.append(mine)
    return out


def test_pachinko_matches_a_hand_run_including_labels_that_run_out():
    # 3 coarse labels of 2 fine ones; fine label 5 has a single sample, fine label 1 two: both run out
    coarse_of = [0, 0, 1, 1, 2, 2]
    labels = [0] * 6 + [1] * 2 + [2] * 5 + [3] * 5 + [4] * 4 + [5] * 1
    y = torch.tensor(labels)
    for seed in (0, 1, 2):
        got = pachinko(y, 4, generator=_g(seed), samples_per_client=5, alpha=0.5, beta=1.0, coarse_of=coarse_of)
        want = _hand_pachinko(labels, coarse_of, 4, 5, 0.5, 1.0, seed)
        assert [p.tolist() for p in got] == want, seed
        _disjoint_cover(got, len(labels), everything=False)
    # every sample taken (4 clients x 5 + the 3 left would not fit a fifth): exhaustion is handled to the end
    full = pachinko(y, 23, generator=_g(0), samples_per_client=1, alpha=0.1, beta=10.0, coarse_of=coarse_of)
    _disjoint_cover(full, len(labels))


def _pachinko_cifar_shape(num_clients, per_label):
    y = torch.arange(100).repeat_interleave(per_label)
    parts = pachinko(y, num_clients, generator=_g(0))
    _disjoint_cover(parts, 100 * per_label, everything=num_clients * 100 == y.numel())
    assert {len(p) for p in parts} == {100}
    coarse = torch.tensor(CIFAR100_COARSE)
    # Dir(0.1) over 20 coarse labels: a client's most common coarse label holds a third of its samples or more
    # for most clients (an iid client's: about 10 of 100)
    top = sorted(Counter(coarse[y[p]].tolist()).most_common(1)[0][1] for p in parts[:50])
    assert top[len(top) // 2] > 33


def test_pachinko_on_cifar100_labels_gives_disjoint_clients_of_100_concentrated_on_few_coarse_labels():
    _pachinko_cifar_shape(50, 60)
    with pytest.raises(ValueError) as err:
        pachinko(torch.arange(120), 1, generator=_g(), samples_per_client=10)
    assert str(err.value).startswith("partition.coarse_of=\"null (CIFAR-100's)\" is not allowed: it maps 100 fine "
                                     "labels, but the labels run to 119")


@pytest.mark.slow  # 50,000 draws: several seconds
def test_pachinko_splits_all_of_cifar100_into_reddis_500_clients():
    _pachinko_cifar_shape(500, 500)


def test_partition_noise_is_a_key_of_any_partition_checked_before_anything_is_built():
    from conftest import compose_config
    from fedagg.config.schema import check_config
    from fedagg.results.groups import GROUPS

    check_config(compose_config("+partition.noise=0.2", "model=mlp"), GROUPS)
    with pytest.raises(ValueError) as err:
        check_config(compose_config("+partition.noise=abc", "model=mlp"), GROUPS)
    assert str(err.value) == "partition.noise='abc' is not allowed; it must be a number"


@pytest.mark.slow  # three short runs
def test_a_noisy_run_keeps_the_split_and_changes_only_what_clients_see(tmp_path):
    import csv
    import json

    from conftest import compose_config
    from fedagg.run import train

    base = ["rounds=1", "device=cpu", "partition=iid"]
    plain = train(compose_config(*base), tmp_path / "plain")
    noisy = train(compose_config(*base, "+partition.noise=1.0"), tmp_path / "noisy")
    skew = train(compose_config(*base[:2], "partition=feature_skew", "partition.noise=1.0"), tmp_path / "skew")
    split = [json.loads((tmp_path / r / "partition.json").read_text()) for r in ("plain", "noisy", "skew")]
    assert split[0] == split[1] == split[2]  # the same iid split; only the images differ
    assert plain["status"] == noisy["status"] == skew["status"] == "completed"
    assert noisy["config"]["partition"]["noise"] == 1.0 and "noise" not in plain["config"]["partition"]
    loss = [float(next(csv.DictReader(open(tmp_path / r / "metrics.csv")))["train_loss"]) for r in ("plain", "noisy", "skew")]
    assert abs(loss[1] - loss[0]) > 1e-3  # the clients trained on other images (float noise: 1e-6 would be rounding)
    assert loss[2] == pytest.approx(loss[1], rel=1e-6)  # feature_skew is iid + partition.noise, same streams
    with pytest.raises(ValueError, match=r"^partition\.noise=-0\.5 is not allowed; it must be a finite number at least 0"):
        train(compose_config(*base, "+partition.noise=-0.5"), tmp_path / "bad")
