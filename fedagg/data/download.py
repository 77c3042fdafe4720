"""Datasets with a public source are downloaded on first use (`data.download`, true by default).

A download goes into a scratch folder beside the dataset, is checked against its MD5 (or the
SHA-256 its publisher gives, written "sha256:<hex>"),
extracted there, and only then renamed into place, so an interrupted, refused or failed
download leaves nothing half-written (nor the empty folders it made for the data). Runs that need the same dataset at once (the jobs of
a sweep) take a lock per dataset and folder, kept in the cache rather than the data folder,
and the second finds the files the first put there. The official URLs and checksums are
torchvision's for MNIST, Fashion-MNIST and CIFAR, the archive's own for Tiny-ImageNet, and
TensorFlow Federated's (its simulation/datasets code) for the FEMNIST and Shakespeare h5 files.
ImageNet is never downloaded (its licence needs a registration).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tqdm.auto import tqdm

from fedagg.data.files import cache_folder

TIMEOUT_S = 30  # per connection attempt and read: an unreachable host fails fast instead of hanging
CHUNK = 1 << 20


class DownloadError(FileNotFoundError):
    """A missing dataset that could not be downloaded; the message names the dataset, URL, folder and remedy."""


@dataclass(frozen=True)
class Source:
    files: tuple[tuple[str, str], ...]  # (url, md5 or "sha256:<hex>") of every file to fetch
    target: str  # what the download creates under data.root
    archive: bool  # extract the files (their content includes `target`) rather than place them in `target`
    bare: bool = False  # an archive of loose files (TFF's): what it extracts becomes `target` itself


def _torchvision(name: str) -> Source:
    from torchvision import datasets as tv

    if name in ("mnist", "fmnist"):
        cls = tv.MNIST if name == "mnist" else tv.FashionMNIST
        return Source(tuple((cls.mirrors[0] + f, md5) for f, md5 in cls.resources), f"{cls.__name__}/raw", False)
    cls = tv.CIFAR10 if name == "cifar10" else tv.CIFAR100
    return Source(((cls.url, cls.tgz_md5),), cls.base_folder, True)


TINY_IMAGENET = Source((("http://cs231n.stanford.edu/tiny-imagenet-200.zip", "90528d7ca1a48142e341f4ef8d21d0de"),),
                       "tiny-imagenet-200", True)
# TensorFlow Federated's copies of LEAF's FEMNIST (3,400 writers) and Shakespeare (715 roles), one train and one
# test h5 file per archive, loose; the SHA-256s are those TFF's own loaders check (tensorflow_federated/python/
# simulation/datasets/emnist.py, fed_emnist with only_digits=False, and shakespeare.py). Unpacked into
# data.root/<name>/tff/ (fetch is given data.root/<name> as its root).
TFF = "https://storage.googleapis.com/tff-datasets-public/"
TFF_FEMNIST = Source(((TFF + "fed_emnist.tar.bz2",
                       "sha256:fe1ed5a502cea3a952eb105920bff8cffb32836b5173cb18a57a32c3606f3ea0"),), "tff", True, bare=True)
TFF_SHAKESPEARE = Source(((TFF + "shakespeare.tar.bz2",
                           "sha256:0285be9906cb5f268092eee4edeeacfc2af4574f2941f7cc2f08a321d7f5c707"),), "tff", True,
                         bare=True)
FIXED = {"tinyimagenet": TINY_IMAGENET, "femnist": TFF_FEMNIST, "shakespeare": TFF_SHAKESPEARE}
SOURCES: dict[str, Source] = {}  # filled on first use (torchvision's class attributes); tests replace entries


def source(name: str) -> Source:
    if name not in SOURCES:
        SOURCES[name] = FIXED[name] if name in FIXED else _torchvision(name)
    return SOURCES[name]


@contextmanager
def _lock(name: str, root: Path):
    key = hashlib.sha1(f"{name}:{root}".encode()).hexdigest()[:16]
    path = cache_folder("locks") / f"download-{name}-{key}.lock"
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes, also if the process dies
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch_file(url: str, checksum: str, into: Path) -> Path:
    """Stream `url` into the folder `into` with a progress bar, checking the MD5 (or "sha256:<hex>") on the way."""
    path = into / url.rsplit("/", 1)[-1]
    algorithm, _, expected = checksum.rpartition(":")
    digest = hashlib.new(algorithm or "md5")
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, open(path, "wb") as out:
        total = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(total=total, unit="B", unit_scale=True, desc=path.name, file=sys.stderr,
                  disable=not sys.stderr.isatty()) as bar:
            while chunk := response.read(CHUNK):
                out.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
        if total is not None and out.tell() != total:
            raise DownloadError(f"the connection closed after {out.tell()} of {total} bytes")
    if digest.hexdigest() != expected:
        label = "SHA-256" if algorithm == "sha256" else "MD5"
        raise DownloadError(f"its {label} is {digest.hexdigest()}, not the expected {expected}")
    return path


def fetch(name: str, root: Path, how: str, present: Callable[[], bool], only: Sequence[str] | None = None) -> None:
    """Download dataset `name` into `root` unless `present()` says it is there (checked again under the
    lock: another run may have just fetched it). `only`: those files of a source that is not an archive
    (to replace a damaged one). A file already there is replaced only by a copy whose MD5 matched.
    Raises DownloadError, in one line."""
    from torchvision.datasets.utils import extract_archive

    src = source(name)
    files = [(url, md5) for url, md5 in src.files if only is None or url.rsplit("/", 1)[-1] in only]
    target = root / src.target
    url = files[0][0]
    with _lock(name, root):
        if present():
            return
        scratch, made = None, [d for d in (root, *root.parents) if not d.exists()]  # deepest first
        try:
            root.mkdir(parents=True, exist_ok=True)
            scratch = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}-download-"))
            for url, md5 in files:
                path = _fetch_file(url, md5, scratch)
                if src.archive:
                    extract_archive(str(path), str(scratch / "extracted"))
            if src.archive:  # a leftover target must be moved first
                os.replace(scratch / "extracted" / ("" if src.bare else src.target), target)
            else:
                target.mkdir(parents=True, exist_ok=True)
                for url, _ in files:
                    file = url.rsplit("/", 1)[-1]
                    os.replace(scratch / file, target / file)
        except (OSError, urllib.error.URLError, DownloadError, RuntimeError) as err:
            reason = getattr(err, "reason", None) or err
            error = DownloadError(f"{name}: could not download {url} into {root} ({reason}); to provide it by hand, "
                                  f"{how}, or set data.download=false to be told what is missing")
            error.reason = f"could not download {url} into {root} ({reason})"  # for a caller's own sentence
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            for folder in made:  # the folders made for it: a data folder that looks ready but holds nothing
                try:
                    folder.rmdir()
                except OSError:  # another run's files came in meanwhile
                    break
            raise error from err
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
