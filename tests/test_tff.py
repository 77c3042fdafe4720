"""FEMNIST and Shakespeare from TFF's h5 files: the layout read exactly, TFF's split kept, LEAF's files preferred,
and the download (checked by SHA-256, unpacked atomically) from tiny archives in TFF's format."""

import hashlib

import numpy as np
import pytest
import torch

pytest.importorskip("h5py", reason="h5py not installed (pip install 'fedagg[natural]'): TFF's h5 files untested")

from fake_leaf import write_femnist as write_leaf_femnist  # noqa: E402
from fake_tff import FEMNIST_FILES, SHAKESPEARE_FILES, archive, write_femnist, write_shakespeare  # noqa: E402
from fedagg.data import download, leaf  # noqa: E402
from fedagg.data.download import Source  # noqa: E402
from fedagg.data.leaf import VOCABULARY  # noqa: E402

MEAN = dict(mean=[0.0], std=[1.0])


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache"))


def test_femnist_reads_tffs_pixels_and_labels_exactly_and_keeps_tffs_split(tmp_path):
    writers = write_femnist(tmp_path / "femnist" / "tff")
    b = leaf.femnist(str(tmp_path), **MEAN)
    assert b.num_classes == 62 and b.train_x.dtype == torch.uint8
    for owner, cid in enumerate(["f0001_40", "f0002_07"]):  # sorted ids: f0001_40 first though written second
        for split, (x, y) in zip(("train", "test"), writers[cid]):
            rows = getattr(b, f"{split}_owner") == owner
            assert torch.equal(getattr(b, f"{split}_x")[rows], torch.from_numpy(x))  # TFF's own split, in order
            assert getattr(b, f"{split}_y")[rows].tolist() == y.tolist()
    assert b.train_owner.tolist() == [0] * 4 + [1] * 3 and b.test_owner.tolist() == [0] + [1] * 2
    assert len(list((tmp_path / "cache").glob("femnist-tff-*.pt"))) == 1
    again = leaf.femnist(str(tmp_path), **MEAN)  # from the cache
    assert torch.equal(again.test_x, b.test_x) and torch.equal(again.train_owner, b.train_owner)


def windows(line: str) -> list[list[int]]:
    """LEAF's samples of one line, by hand: 80 spaces before it, then one 81-character window per character."""
    text = " " * 80 + line
    return [[VOCABULARY.index(c) for c in text[i:i + 81]] for i in range(len(line))]


def test_shakespeare_snippets_become_leafs_80_character_samples(tmp_path):
    write_shakespeare(tmp_path / "shakespeare" / "tff", {
        "THE_TEMPEST_ARIEL": (["All hail,   great master!\nGrave sir, hail!\n"], ["I come\n"]),
        "AS_YOU_LIKE_IT_CELIA": (["Why, cousin!", "Not a word? ~"], ["No."]),
        "HAMLET_GHOST": (["Mark me."], [""]),  # nothing to test it on: left out
    })
    b = leaf.shakespeare(str(tmp_path))
    assert b.inputs == "tokens" and b.train_x.shape[1] == 81
    celia_train = windows("Why, cousin!") + windows("Not a word?  ")  # '~' is not in LEAF's vocabulary: a space
    ariel_train = windows("All hail, great master!\n") + windows("Grave sir, hail!\n")  # runs of spaces collapsed
    assert b.train_x.tolist() == celia_train + ariel_train  # sorted ids: AS_YOU_LIKE_IT_CELIA is client 0
    assert b.test_x.tolist() == windows("No.") + windows("I come\n")
    assert b.train_owner.tolist() == [0] * len(celia_train) + [1] * len(ariel_train)
    assert b.test_owner.tolist() == [0] * 3 + [1] * 7
    assert torch.equal(b.train_y, b.train_x[:, -1].long()) and b.test_y.tolist()[-1] == VOCABULARY.index("\n")


def test_leafs_files_are_preferred_to_tffs(tmp_path):
    write_femnist(tmp_path / "femnist" / "tff")
    write_leaf_femnist(tmp_path, sizes=((10,),))
    b = leaf.femnist(str(tmp_path), **MEAN)
    assert (len(b.train_y), len(b.test_y)) == (9, 1)  # LEAF's one writer of 10, cut 90/10, not TFF's 7 + 3


def test_missing_files_name_both_sources_and_fetch_nothing_without_download(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        leaf.femnist(str(tmp_path), **MEAN, download=False)
    lines = str(err.value).split("\n")
    assert lines[0] == f"femnist not found: no such folder in {tmp_path / 'femnist' / 'all_data'}"
    assert (f"put fed_emnist_train.h5 and fed_emnist_test.h5 (unpacked from "
            f"https://storage.googleapis.com/tff-datasets-public/fed_emnist.tar.bz2) in {tmp_path / 'femnist' / 'tff'}"
            in lines[2])
    assert not (tmp_path / "femnist").exists()


def test_the_sources_are_tffs_with_the_sha256_its_loaders_check():
    assert download.source("femnist").files == (("https://storage.googleapis.com/tff-datasets-public/fed_emnist.tar.bz2",
                                                 "sha256:fe1ed5a502cea3a952eb105920bff8cffb32836b5173cb18a57a32c3606f3ea0"),)
    assert download.source("shakespeare").files == (
        ("https://storage.googleapis.com/tff-datasets-public/shakespeare.tar.bz2",
         "sha256:0285be9906cb5f268092eee4edeeacfc2af4574f2941f7cc2f08a321d7f5c707"),)


@pytest.fixture
def published(tmp_path, monkeypatch):
    """TFF's two archives built from tiny files and served from file:// URLs with their true SHA-256s."""
    made = tmp_path / "made"
    writers = write_femnist(made)
    write_shakespeare(made, {"ROLE_A": (["To be, or not to be\n"], ["that is\n"])})
    served = {}
    for name, names in (("femnist", FEMNIST_FILES), ("shakespeare", SHAKESPEARE_FILES)):
        path = archive(made, names, made)
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        served[name] = (path.as_uri(), f"sha256:{sha}")
        monkeypatch.setitem(download.SOURCES, name, Source((served[name],), "tff", True, bare=True))
    return writers, served


def test_a_missing_dataset_is_fetched_checked_and_unpacked_in_place(tmp_path, published):
    writers, _ = published
    root = tmp_path / "data"
    b = leaf.femnist(str(root), **MEAN, download=True)
    assert sorted(p.name for p in (root / "femnist").iterdir()) == ["tff"]  # no archive or scratch folder left
    assert sorted(p.name for p in (root / "femnist" / "tff").iterdir()) == sorted(FEMNIST_FILES)
    assert torch.equal(b.test_x[b.test_owner == 1], torch.from_numpy(writers["f0002_07"][1][0]))
    s = leaf.shakespeare(str(root), download=True)
    assert s.train_x.tolist() == windows("To be, or not to be\n") and s.test_x.tolist() == windows("that is\n")


def test_a_damaged_archive_is_refused_by_its_sha256_and_leaves_nothing(tmp_path, published, monkeypatch):
    _, served = published
    url, good = served["femnist"]
    damaged = tmp_path / "made" / "damaged" / "fed_emnist.tar.bz2"
    damaged.parent.mkdir()
    data = bytearray((tmp_path / "made" / "fed_emnist.tar.bz2").read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    monkeypatch.setitem(download.SOURCES, "femnist", Source(((damaged.as_uri(), good),), "tff", True, bare=True))
    root = tmp_path / "data"
    with pytest.raises(download.DownloadError) as err:
        leaf.femnist(str(root), **MEAN, download=True)
    actual = hashlib.sha256(bytes(data)).hexdigest()
    assert str(err.value).startswith(f"femnist: could not download {damaged.as_uri()} into {root / 'femnist'} "
                                     f"(its SHA-256 is {actual}, not the expected {good[len('sha256:'):]}); ")
    assert "\n" not in str(err.value)
    assert not root.exists()  # no scratch folder, no half-unpacked file, and not the folders the download made


def test_without_h5py_the_error_is_one_line_before_any_download(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_h5py(name, *args, **kwargs):
        if name == "h5py":
            raise ImportError("No module named 'h5py'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_h5py)
    monkeypatch.setitem(download.SOURCES, "femnist", Source((("http://127.0.0.1:9/x.tar.bz2", "sha256:0"),), "tff",
                                                            True, bare=True))
    with pytest.raises(ValueError, match=r"^reading TFF's FEMNIST/Shakespeare h5 files needs h5py: pip install "
                                         r"'fedagg\[natural\]' \(or pip install h5py\)$"):
        leaf.femnist(str(tmp_path), **MEAN, download=True)
    assert not (tmp_path / "femnist").exists()


def test_pixels_round_to_the_nearest_of_256_levels():
    assert leaf._pixels_to_uint8(np.array([0.0, 0.5, 1 / 255 * 0.49, 1.2, -0.1], np.float32)).tolist() == [0, 128, 0,
                                                                                                           255, 0]


@pytest.mark.slow
def test_femnist_and_shakespeare_run_two_rounds_from_fetched_tff_files_in_both_engines(tmp_path, published):
    from test_natural_runs import _two_rounds

    write_shakespeare(tmp_path / "data" / "shakespeare" / "tff", {  # three roles, enough text for batches of 4
        f"ROLE_{r}": ([f"Line {r} of the play, long enough to read.\nAnd a second one.\n"], [f"Its test {r}.\n"])
        for r in range(3)})
    root = f"data.root={tmp_path / 'data'}"
    assert _two_rounds(tmp_path, "femnist", ["model=cnn_femnist", root, "num_clients=null", "data.download=true",
                                             "client.batch_size=2"])["parallel"][1] == 2
    assert (tmp_path / "data" / "femnist" / "tff" / FEMNIST_FILES[0]).is_file()  # fetched by the first run
    assert _two_rounds(tmp_path, "shakespeare", ["model=lstm_shakespeare", root, "num_clients=null", "model.hidden=32",
                                                 "client.batch_size=4"])["parallel"][1] == 3
