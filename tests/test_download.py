"""Downloads of missing datasets, against a local HTTP server serving archives in the real formats."""

import hashlib
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import compose_config
from fake_datasets import write_cifar, write_fashion_mnist, write_tiny_imagenet
from fedagg.data import datasets, download, jpeg_datasets
from fedagg.data.download import Source
from fedagg.data.files import DataError
from fedagg.run import train

CIFAR_MEAN = dict(mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25])


class Archives(BaseHTTPRequestHandler):
    """Serves server.files by name, counts requests, and cuts the ones in server.cut off half-way."""

    def do_GET(self):  # noqa: N802 - http.server's name
        name = self.path.lstrip("/")
        self.server.hits.append(name)
        data = self.server.files.get(name)
        if data is None:
            self.send_error(404)
            return
        time.sleep(self.server.delay)
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2] if name in self.server.cut else data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    write_cifar(src, per_file=6)
    with tarfile.open(tmp_path / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(src / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    write_tiny_imagenet(src)
    shutil.make_archive(str(tmp_path / "tiny-imagenet-200"), "zip", root_dir=src, base_dir="tiny-imagenet-200")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Archives)
    httpd.fmnist = write_fashion_mnist(src)  # served file by file, as the official MNIST mirrors do
    fmnist_files = sorted((src / "FashionMNIST" / "raw").iterdir())
    httpd.files = {p.name: p.read_bytes() for p in (tmp_path / "cifar-10-python.tar.gz", tmp_path / "tiny-imagenet-200.zip",
                                                    *fmnist_files)}
    httpd.hits, httpd.cut, httpd.delay = [], set(), 0.0
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/"
    md5 = {name: hashlib.md5(data).hexdigest() for name, data in httpd.files.items()}
    monkeypatch.setitem(download.SOURCES, "cifar10", Source(((url + "cifar-10-python.tar.gz", md5["cifar-10-python.tar.gz"]),),
                                                           "cifar-10-batches-py", True))
    monkeypatch.setitem(download.SOURCES, "tinyimagenet", Source(((url + "tiny-imagenet-200.zip", md5["tiny-imagenet-200.zip"]),),
                                                                "tiny-imagenet-200", True))
    monkeypatch.setitem(download.SOURCES, "fmnist", Source(tuple((url + p.name, md5[p.name]) for p in fmnist_files),
                                                          "FashionMNIST/raw", False))
    httpd.src = src
    yield httpd
    httpd.shutdown()


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


@pytest.mark.parametrize("name, folder, extra", [
    ("cifar10", "cifar-10-batches-py", ["dataset.verify_md5=false"]),  # tiny files: not the official checksums
    ("tinyimagenet", "tiny-imagenet-200", []),
])
def test_a_missing_dataset_is_downloaded_verified_and_used(tmp_path, server, name, folder, extra):
    root = tmp_path / "data"
    summary = train(compose_config(f"dataset={name}", f"data.root={root}", "model=mlp", "partition=iid", "rounds=2",
                                   "num_clients=2", "device=cpu", *extra), tmp_path / "run")
    assert summary["status"] == "completed" and summary["rounds_completed"] == 2
    assert leftovers(root) == [folder]  # the dataset, and no archive or scratch folder beside it
    assert len(server.hits) == 1
    train(compose_config(f"dataset={name}", f"data.root={root}", "model=mlp", "partition=iid", "rounds=1",
                         "num_clients=2", "device=cpu", *extra), tmp_path / "again")
    assert len(server.hits) == 1  # there now: not fetched again


def test_a_wrong_checksum_is_refused_and_cleaned_up(tmp_path, server, monkeypatch):
    good = download.SOURCES["cifar10"]
    monkeypatch.setitem(download.SOURCES, "cifar10", Source(((good.files[0][0], "0" * 32),), good.target, True))
    root = tmp_path / "data"
    with pytest.raises(ValueError, match=r"^cifar10: could not download http://127.0.0.1:\d+/cifar-10-python.tar.gz "
                                         r"into .*data \(its MD5 is [0-9a-f]{32}, not the expected 0{32}\); to provide") as err:
        train(compose_config("dataset=cifar10", f"data.root={root}", "device=cpu", "rounds=1"), tmp_path / "run")
    assert "\n" not in str(err.value) and type(err.value).__name__ == "SetupError"
    assert leftovers(root) == [] and not (tmp_path / "run" / "metrics.csv").exists()


def test_a_server_that_stops_mid_way_leaves_nothing_half_written(tmp_path, server):
    server.cut.add("tiny-imagenet-200.zip")
    root = tmp_path / "data"
    with pytest.raises(download.DownloadError, match=r"connection closed after \d+ of \d+ bytes"):
        jpeg_datasets.tinyimagenet(str(root), mean=[0.5] * 3, std=[0.25] * 3, download=True)
    assert leftovers(root) == []


# A separate interpreter per run, as two real runs would be: a forked child of this threaded
# process (HTTP server, torch pools) can deadlock, and a hung child must not outlive the test.
LOAD_CIFAR = """
import sys
from fedagg.data import datasets, download
from fedagg.data.download import Source
download.SOURCES["cifar10"] = Source(((sys.argv[1], sys.argv[2]),), "cifar-10-batches-py", True)
datasets.cifar10(sys.argv[3], mean=[0.5] * 3, std=[0.25] * 3, verify_md5=False, download=True)
"""


@pytest.mark.slow  # a CLI sweep or several subprocess runs: ~8-10 s on 2 idle cores
def test_two_runs_needing_the_same_dataset_download_it_once(tmp_path, server):
    server.delay = 0.5  # the first holds the lock long enough for the second to wait on it
    root = tmp_path / "data"
    url, md5 = download.SOURCES["cifar10"].files[0]
    jobs = [subprocess.Popen([sys.executable, "-c", LOAD_CIFAR, url, md5, str(root)], stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    try:
        errors = [job.communicate(timeout=120)[1] for job in jobs]
    finally:
        for job in jobs:
            job.kill()
    assert [job.returncode for job in jobs] == [0, 0], errors
    assert len(server.hits) == 1 and leftovers(root) == ["cifar-10-batches-py"]


def test_offline_fails_fast_in_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache"))
    closed = Source((("http://127.0.0.1:9/cifar-10-python.tar.gz", "0" * 32),), "cifar-10-batches-py", True)
    monkeypatch.setitem(download.SOURCES, "cifar10", closed)  # nothing listens on port 9: refused at once
    root = tmp_path / "data"
    start = time.perf_counter()
    with pytest.raises(download.DownloadError) as err:
        datasets.cifar10(str(root), **CIFAR_MEAN, download=True)
    assert time.perf_counter() - start < 5
    message = str(err.value)
    assert "\n" not in message and message.startswith("cifar10: could not download http://127.0.0.1:9/")
    assert str(root) in message and "on a machine with network run" in message  # how to provide it by hand
    assert leftovers(root) == []


def test_imagenet_is_never_downloaded(tmp_path):
    with pytest.raises(datasets.DatasetNotFoundError, match="ImageNet is never downloaded"):
        jpeg_datasets.imagenet(str(tmp_path), mean=[0.5] * 3, std=[0.25] * 3, download=True)
    assert leftovers(tmp_path) == []


def test_data_root_comes_from_fedagg_data(monkeypatch):
    monkeypatch.setenv("FEDAGG_DATA", "/srv/datasets")
    assert compose_config().data.root == "/srv/datasets"
    monkeypatch.delenv("FEDAGG_DATA")
    assert compose_config().data.root == "data" and compose_config().data.download is True


def damaged_fmnist(root: Path, server) -> Path:
    """The served Fashion-MNIST copied to root, one .gz cut short as an interrupted copy leaves it."""
    shutil.copytree(server.src / "FashionMNIST", root / "FashionMNIST")
    gz = root / "FashionMNIST" / "raw" / "train-labels-idx1-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:20])
    return gz


def test_a_damaged_gz_is_downloaded_again_and_replaced_by_the_checked_copy(tmp_path, server, caplog):
    root = tmp_path / "data"
    gz = damaged_fmnist(root, server)
    with caplog.at_level("WARNING"):
        b = datasets.fmnist(str(root), mean=[0.5], std=[0.25], download=True)
    assert caplog.messages == [f"fmnist: {gz} is damaged (EOFError: Compressed file ended before the end-of-stream "
                               "marker was reached); downloading it again"]
    assert server.hits == ["train-labels-idx1-ubyte.gz"]  # that file only
    assert gz.read_bytes() == server.files[gz.name]
    assert b.train_y.tolist() == server.fmnist["train_y"].tolist() and b.test_y.tolist() == server.fmnist["test_y"].tolist()
    assert leftovers(root) == ["FashionMNIST"]  # no scratch folder left


def test_a_damaged_gz_that_cannot_be_downloaded_again_is_left_alone(tmp_path, server):
    root = tmp_path / "data"
    gz = damaged_fmnist(root, server)
    damaged = gz.read_bytes()
    server.cut.add(gz.name)
    url = next(url for url, _ in download.SOURCES["fmnist"].files if url.endswith(f"/{gz.name}"))
    with pytest.raises(DataError) as err:
        datasets.fmnist(str(root), mean=[0.5], std=[0.25], download=True)
    half = len(server.files[gz.name]) // 2
    how = (f"on a machine with network run python -c \"import torchvision; torchvision.datasets.FashionMNIST('DIR', "
           f"download=True)\" and copy DIR/FashionMNIST to {root / 'FashionMNIST'} (or set data.root to a folder that "
           "holds FashionMNIST/)")
    assert str(err.value) == (f"fmnist: {gz} is damaged (EOFError: Compressed file ended before the end-of-stream marker "
                              f"was reached) and was left as it is: could not download {url} into {root} (the connection "
                              f"closed after {half} of {len(server.files[gz.name])} bytes); replace it with a good copy "
                              f"({how})")
    assert gz.read_bytes() == damaged and leftovers(root) == ["FashionMNIST"]
