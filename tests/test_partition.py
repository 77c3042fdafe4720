"""Client partitions (fedagg/data/partition.py) and their reports, on synthetic labels."""

import json
import logging
import re
import struct
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fedagg.data import partition as P
from fedagg.data.partition_report import drawn, partition_stats, save_partition_report

CONF = Path(__file__).resolve().parents[1] / "conf" / "partition"


def make_labels(per_class=500, classes=10, seed=0):
    labels = torch.arange(classes).repeat_interleave(per_class)
    return labels[torch.randperm(labels.numel(), generator=torch.Generator().manual_seed(seed))]


LABELS = make_labels()  # 10 classes × 500, shuffled
N = LABELS.numel()


def split(name, k, seed=1, labels=LABELS, **params):
    return getattr(P, name)(labels, k, generator=torch.Generator().manual_seed(seed), **params)


def sizes(parts):
    return torch.tensor([p.numel() for p in parts])


def num_classes_of(parts, labels=LABELS):
    return [labels[p].unique().numel() for p in parts]


def assert_valid(parts, k, n=N):
    assert isinstance(parts, list) and len(parts) == k
    for p in parts:
        assert p.dtype == torch.int64 and p.dim() == 1 and p.numel() > 0
        assert int(p.min()) >= 0 and int(p.max()) < n
    everything = torch.cat(parts)
    assert everything.unique().numel() == everything.numel(), "clients overlap"


CASES = [
    ("iid", 10, {}),
    ("iid", 10, {"samples_per_client": 300}),
    ("shards", 10, {}),
    ("shards", 3, {"shards_per_client": 2}),
    ("n_class", 10, {}),
    ("n_class", 30, {"classes_per_client": 3, "samples_per_client": 120}),
    ("dirichlet", 20, {"alpha": 0.5}),
    ("power_law", 20, {}),
    ("power_law", 20, {"label_dist": "n_class"}),
    ("mixed", 10, {"samples_per_client": 300, "class_choice": "balanced"}),
    ("mixed", 10, {"samples_per_client": 60}),  # random classes: five 60-sample clients fit even on one class
]
IDS = [f"{name}-{k}-{params}" for name, k, params in CASES]


@pytest.mark.parametrize("name,k,params", CASES, ids=IDS)
def test_split_is_disjoint_non_empty_and_in_range(name, k, params):
    assert_valid(split(name, k, **params), k)


@pytest.mark.parametrize("name,k,params", CASES, ids=IDS)
def test_same_seed_same_split_other_seed_differs(name, k, params):
    a, b, c = (split(name, k, seed=s, **params) for s in (7, 7, 8))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(x.shape == z.shape and torch.equal(x, z) for x, z in zip(a, c))


@pytest.mark.parametrize("name,k,params", [("iid", 7, {}), ("shards", 10, {}), ("shards", 3, {}),
                                           ("dirichlet", 10, {}), ("n_class", 5, {})])
def test_split_covers_every_sample_once(name, k, params):
    assert torch.equal(torch.cat(split(name, k, **params)).sort().values, torch.arange(N))


def test_iid_sizes():
    s = sizes(split("iid", 7))
    assert int(s.max() - s.min()) <= 1 and int(s.sum()) == N
    assert sizes(split("iid", 7, samples_per_client=123)).tolist() == [123] * 7


def test_shards_align_with_classes_when_sizes_divide():
    # 100 shards of 50 samples: every shard lies inside one class of 500
    parts = split("shards", 50, shards_per_client=2)
    assert sizes(parts).tolist() == [100] * 50
    assert max(num_classes_of(parts)) <= 2


def test_shards_are_runs_of_the_label_order():
    # EWWA-FL's 3 clients × 2 shards: each shard is a contiguous stretch of the label-sorted
    # data, so a client's classes form at most 2 runs of consecutive class ids
    parts = split("shards", 3, shards_per_client=2)
    for p in parts:
        present = LABELS[p].unique()
        runs = 1 + int((present.diff() > 1).sum())
        assert runs <= 2
    lo, hi = N // 6, -(-N // 6)
    assert all(2 * lo <= n <= 2 * hi for n in sizes(parts).tolist())


def test_n_class_exact_classes_and_sizes():
    parts = split("n_class", 20, classes_per_client=3, samples_per_client=200)
    assert sizes(parts).tolist() == [200] * 20
    assert num_classes_of(parts) == [3] * 20


@pytest.mark.parametrize("k,expected", [(10, 500), (5, 1000)])
def test_n_class_null_size_is_largest_equal_size(k, expected):
    # 2 classes each, loads balanced: every class of 500 is shared by 2k/10 clients
    parts = split("n_class", k, classes_per_client=2)
    assert sizes(parts).tolist() == [expected] * k
    assert num_classes_of(parts) == [2] * k


def test_n_class_pool_too_small_names_the_class():
    with pytest.raises(ValueError, match=r"^partition\.samples_per_client=501 .*class \d+ .*501 .*only 500.*smaller partition\.samples_per_client"):
        split("n_class", 5, classes_per_client=1, samples_per_client=501)


def max_class_share(parts):
    return sum(float(torch.bincount(LABELS[p], minlength=10).max()) / p.numel() for p in parts) / len(parts)


def test_dirichlet_skew_grows_as_alpha_shrinks():
    skew = [sum(max_class_share(split("dirichlet", 10, seed=s, alpha=a)) for s in range(3)) / 3
            for a in (0.1, 1.0, 100.0)]
    assert skew[0] > skew[1] > skew[2]
    assert skew[2] < 0.2  # near-IID: the largest class barely above its 10% share


def test_dirichlet_min_size_and_giving_up():
    assert int(sizes(split("dirichlet", 20, alpha=0.3, min_size=50)).min()) >= 50
    pattern = r"max_retries=5 .*alpha=0\.05.*num_clients=10.*min_size=450.*smallest client had \d+"
    with pytest.raises(ValueError, match=pattern):
        split("dirichlet", 10, alpha=0.05, min_size=450, max_retries=5)


@pytest.mark.parametrize("k", [10, 20, 100])
def test_power_law_few_clients_hold_most(k):
    s = sizes(split("power_law", k)).sort(descending=True).values
    assert int(s.sum()) <= N and int(s.min()) >= 10
    assert float(s[: k // 5].sum()) > 0.5 * float(s.sum())


def test_power_law_zero_exponent_is_balanced():
    s = sizes(split("power_law", 10, exponent=0.0))
    assert int(s.max()) == int(s.min())


def test_power_law_n_class_labels():
    parts = split("power_law", 30, label_dist="n_class", classes_per_client=2, min_size=20)
    s = sizes(parts).sort(descending=True).values
    assert num_classes_of(parts) == [2] * 30 and int(s.min()) >= 20
    assert float(s[:6].sum()) > 0.5 * float(s.sum())


@pytest.mark.parametrize("num_iid,cpc", [(5, 1), (3, 2)])
def test_mixed_iid_then_x_class(num_iid, cpc):
    labels = make_labels(per_class=4000)  # any 5 random 600-sample picks fit, as on MNIST
    parts = split("mixed", 10, labels=labels, num_iid=num_iid, classes_per_client=cpc)
    assert_valid(parts, 10, labels.numel())
    assert sizes(parts).tolist() == [600] * 10
    counts = num_classes_of(parts, labels)
    assert counts[:num_iid] == [10] * num_iid and counts[num_iid:] == [cpc] * (10 - num_iid)


def _one_class_picks(class_choice, seed):
    """The class of each of the 5 one-class clients of a 5 + 5 mixed split."""
    labels = make_labels(per_class=2000)
    parts = split("mixed", 10, seed=seed, labels=labels, samples_per_client=300, class_choice=class_choice)
    return [int(labels[p[0]]) for p in parts[5:]]


def test_mixed_random_classes_are_independent_draws_that_may_overlap():
    picks = [_one_class_picks("random", seed) for seed in range(400)]
    # 5 independent uniform draws of 10 classes are all distinct with probability
    # 10·9·8·7·6 / 10^5 = 0.3024; over 400 splits that share is 0.30 ± 0.023 (one s.d.)
    distinct = sum(len(set(p)) == 5 for p in picks) / len(picks)
    assert 0.23 < distinct < 0.37
    counts = torch.bincount(torch.tensor(picks).flatten(), minlength=10)
    assert int(counts.min()) > 150 and int(counts.max()) < 250  # 200 expected per class: uniform


def test_mixed_balanced_classes_never_overlap_below_one_per_class():
    assert all(len(set(_one_class_picks("balanced", seed))) == 5 for seed in range(50))


def test_mixed_class_choice_is_checked():
    with pytest.raises(ValueError, match=r"^partition.class_choice='even' is not allowed; choose one of random, balanced"):
        split("mixed", 10, class_choice="even")


def test_mixed_all_iid():
    parts = split("mixed", 5, num_iid=5, samples_per_client=1000)
    assert torch.equal(torch.cat(parts).sort().values, torch.arange(N))


# (function, num_clients, params, text the message must hold, rejected before any draw)
BAD = [
    ("iid", 0, {}, "num_clients=0", True),
    ("iid", N + 1, {}, f"num_clients={N + 1}", True),
    ("iid", 2.5, {}, "num_clients=2.5", True),
    ("iid", 10, {"samples_per_client": 501}, "samples_per_client=501", True),
    ("iid", 10, {"samples_per_client": -1}, "samples_per_client=-1", True),
    ("shards", 10, {"shards_per_client": 0}, "shards_per_client=0", True),
    ("shards", 10, {"shards_per_client": 501}, "shards_per_client=501", True),
    ("n_class", 10, {"classes_per_client": 0}, "classes_per_client=0", True),
    ("n_class", 10, {"classes_per_client": 11}, "classes_per_client=11", True),
    ("n_class", 10, {"samples_per_client": 1}, "samples_per_client=1", True),
    ("n_class", 10, {"samples_per_client": 501}, "samples_per_client=501", True),
    ("dirichlet", 10, {"alpha": 0}, "alpha=0", True),
    ("dirichlet", 10, {"alpha": -1.0}, "alpha=-1.0", True),
    ("dirichlet", 10, {"min_size": -5}, "min_size=-5", True),
    ("dirichlet", 10, {"min_size": 501}, "min_size=501", True),
    ("dirichlet", 10, {"max_retries": 0}, "max_retries=0", True),
    ("power_law", 10, {"exponent": -1.0}, "exponent=-1.0", True),
    ("power_law", 10, {"min_size": 501}, "min_size=501", True),
    ("power_law", 10, {"label_dist": "zipf"}, "label_dist='zipf'", True),
    ("power_law", 10, {"label_dist": "n_class", "classes_per_client": 11}, "classes_per_client=11", True),
    ("mixed", 10, {"num_iid": 11}, "num_iid=11", True),
    ("mixed", 10, {"num_iid": -1}, "num_iid=-1", True),
    ("mixed", 10, {"classes_per_client": 11}, "classes_per_client=11", True),
    ("mixed", 10, {"samples_per_client": 600}, "samples_per_client=600", True),
    # 5 IID clients take 2000 samples, leaving ~300 a class for 400-sample one-class clients
    ("mixed", 10, {"samples_per_client": 400}, "samples_per_client=400", False),
]


@pytest.mark.parametrize("name,k,params,text,early", BAD, ids=[b[3] + "-" + b[0] for b in BAD])
def test_impossible_request_is_a_clear_value_error(name, k, params, text, early):
    g = torch.Generator().manual_seed(3)
    state = g.get_state()
    with pytest.raises(ValueError, match=re.escape(text)) as err:
        getattr(P, name)(LABELS, k, generator=g, **params)
    if early:
        assert "must be" in str(err.value)
        assert torch.equal(g.get_state(), state), "validation should come before sampling"


def test_labels_must_be_a_1d_integer_tensor():
    for bad in (LABELS.float(), LABELS.view(50, 100), torch.empty(0, dtype=torch.long)):
        with pytest.raises(ValueError, match="labels"):
            P.iid(bad, 2, generator=torch.Generator())


def test_partition_stats_hand_example():
    labels = torch.tensor([0, 1, 1, 2, 2, 2])
    stats = partition_stats(labels, [torch.tensor([0, 3]), torch.tensor([1, 2, 4, 5])], 4)
    assert stats == {"num_clients": 2, "num_classes": 4, "total": 6, "clients": [
        {"id": 0, "size": 2, "class_counts": [1, 0, 1, 0]},
        {"id": 1, "size": 4, "class_counts": [0, 2, 2, 0]},
    ]}
    with pytest.raises(ValueError, match="num_classes=2"):
        partition_stats(labels, [torch.tensor([0])], 2)


def png_size(path):
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_save_partition_report_writes_json_and_png(tmp_path):
    sizes = []
    for k in (10, 40, 1000):
        stats = partition_stats(LABELS, split("dirichlet", k, alpha=0.5) if k < 100 else split("iid", k), 10)
        run_dir = tmp_path / str(k)
        save_partition_report(stats, run_dir)
        assert json.loads((run_dir / "partition.json").read_text()) == stats
        drawn(run_dir / "partition.png")  # drawn in the background
        sizes.append(png_size(run_dir / "partition.png"))
    assert sizes[1][1] > 2 * sizes[0][1]  # 40 clients get a taller picture, not thinner bars
    assert sizes[2] == (900, 700)  # 1,000 are summarised on one page (a size histogram, a share heatmap)
    assert not list(tmp_path.glob("*/*.tmp"))


def test_every_yaml_instantiates_to_a_valid_split():
    names = sorted(p.stem for p in CONF.glob("*.yaml"))
    assert names == ["dirichlet", "feature_skew", "iid", "mixed", "n_class", "natural", "pachinko", "power_law",
                     "quantity_skew", "shards"]
    labels = make_labels(per_class=4000)  # mixed's defaults (600 a client, random classes) fit any draw, as on MNIST
    for name in names:
        fn = instantiate(OmegaConf.load(CONF / f"{name}.yaml"))
        owners = {"owners": torch.arange(labels.numel()) % 13} if name == "natural" else {}  # a dataset's own clients
        if name == "pachinko":  # its default table is CIFAR-100's: 10 labels need their own coarse labels
            owners = {"coarse_of": [0] * 5 + [1] * 5}
        assert_valid(fn(labels, 10, generator=torch.Generator().manual_seed(0), **owners), 10, labels.numel())


def test_messages_name_the_partition_keys_as_the_command_line_spells_them():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError) as err:
        P.dirichlet(LABELS, 10, generator=g, alpha=0)
    assert str(err.value) == ("partition.alpha=0 is not allowed: it must be a finite number greater than 0.0 "
                              "(smaller is more skewed)")
    with pytest.raises(ValueError) as err:
        P.n_class(LABELS, 10, generator=g, classes_per_client=11)
    assert str(err.value) == ("partition.classes_per_client=11 is not allowed: it must be between 1 and 10 "
                              "(the number of classes present)")
    with pytest.raises(ValueError) as err:
        P.power_law(LABELS, 10, generator=g, min_size=501)
    assert str(err.value).startswith("partition.min_size=501 is not allowed: it must be between 0 and 500")


def test_dirichlet_with_min_size_0_says_it_wanted_one_sample_per_client():
    """min_size=0 still asks for one sample (no client is empty): the message says so, not 'min_size=0 samples'."""
    with pytest.raises(ValueError) as err:
        split("dirichlet", 100, seed=0, alpha=0.001, min_size=0, max_retries=2)
    assert str(err.value) == (
        "dirichlet split failed: in partition.max_retries=2 draws with partition.alpha=0.001 and num_clients=100, "
        "no draw gave every client one sample, as no client may be empty (partition.min_size=0) (the best smallest "
        "client had 0); raise partition.alpha, use fewer clients or raise partition.max_retries")


def test_a_split_drawn_before_in_the_process_is_copied_not_drawn_again(tmp_path, caplog, monkeypatch):
    from fedagg.data import painter

    monkeypatch.setattr(painter._painter, "first", {})  # splits drawn by earlier tests of this process
    caplog.set_level(logging.DEBUG, logger="fedagg.data.partition_report")
    one = partition_stats(LABELS, split("dirichlet", 6, alpha=0.5), 10)
    other = partition_stats(LABELS, split("iid", 6), 10)

    def save(stats, name):
        save_partition_report(stats, tmp_path / name)
        drawn(tmp_path / name / "partition.png")
        return (tmp_path / name / "partition.png").read_bytes()

    def drawings():  # the drawing process's replies: which pictures it drew rather than copied
        return [Path(r.message.split()[0]).parent.name for r in caplog.records if r.message.endswith(" drawn")]

    assert save(one, "a") == save(one, "b")  # the same split under another method: one drawing, copied
    assert save(other, "c") != save(one, "a")
    assert drawings() == ["a", "c"]
    assert save(other, "a") == save(other, "c")  # a's folder now holds the other split: copied from c
    save(one, "d")  # the first picture of `one` no longer stands beside its split: drawn anew
    assert drawings() == ["a", "c", "d"] and (tmp_path / "d" / "partition.png").read_bytes() == save(one, "b")


def test_the_picture_is_drawn_by_another_process_and_is_on_disk_when_the_process_that_asked_exits(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    code = ("import sys, torch\n"
            "from fedagg.data.partition_report import partition_stats, save_partition_report\n"
            "labels = torch.arange(40) % 10\n"
            "save_partition_report(partition_stats(labels, list(torch.arange(40).chunk(4)), 10), sys.argv[1])\n"
            "print('matplotlib' in sys.modules)\n")  # exits without waiting: the interpreter's exit waits
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], cwd=ROOT, capture_output=True,
                          text=True, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "False\n", "")
    assert png_size(tmp_path / "run" / "partition.png")[0] == 900 and not list((tmp_path / "run").glob("*.tmp"))


def test_a_picture_that_fails_is_one_warning_and_no_file(tmp_path, caplog):
    bad = {"num_clients": 2, "num_classes": 3, "total": 1, "clients": [{"id": 0, "size": 1, "class_counts": [1]}]}
    save_partition_report(bad, tmp_path)
    drawn(tmp_path / "partition.png")
    warned = [r.message for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and warned[0].startswith("partition.png was not drawn: ValueError: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["partition.json"]


def test_partition_stats_counts_each_clients_classes_by_hand():
    labels = torch.tensor([0, 2, 2, 1, 0, 2, 1, 1])
    parts = [torch.tensor([1, 2, 5]), torch.tensor([], dtype=torch.long), torch.tensor([0, 3, 4, 7]), torch.tensor([6])]
    stats = partition_stats(labels, parts, 4)
    assert [c["class_counts"] for c in stats["clients"]] == [[0, 0, 3, 0], [0, 0, 0, 0], [2, 2, 0, 0], [0, 1, 0, 0]]
    assert [c["size"] for c in stats["clients"]] == [3, 0, 4, 1] and stats["total"] == 8
    assert [c["id"] for c in stats["clients"]] == [0, 1, 2, 3]
