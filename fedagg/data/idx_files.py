"""The IDX files of MNIST and Fashion-MNIST: extracting the .gz copies, and replacing a damaged one.

Extraction goes beside its destination and is then renamed into place, so concurrent and
interrupted runs never see a half-written file. A .gz that does not decompress is named; with
downloads on it is fetched again, and the user's file is replaced only by a copy whose MD5
matched the official one.
"""

from __future__ import annotations

import gzip
import logging
import math
import os
import shutil
import tempfile
import zlib
from pathlib import Path

from fedagg.data.download import DownloadError, fetch, source
from fedagg.data.files import DataError
from fedagg.data.files import md5 as file_md5

log = logging.getLogger(__name__)


def gzip_size(path: Path) -> int:
    # gzip stores the uncompressed length (mod 2**32) in its last four bytes.
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) < 4:
            return -1  # too short to be a gzip file at all: the extraction says why
        f.seek(-4, os.SEEK_END)
        return int.from_bytes(f.read(4), "little")


def extracted(path: Path, gz: Path) -> bool:
    return path.is_file() and (not gz.is_file() or path.stat().st_size % 2**32 == gzip_size(gz))


def writable(folder: Path) -> bool:
    # root passes os.access on any folder, so a folder with no write bit at all (a shared,
    # deliberately read-only copy) counts as read-only too.
    return os.access(folder, os.W_OK) and bool(folder.stat().st_mode & 0o222)


def place(raw: Path, n: str, target: Path) -> None:
    """Extract raw/n.gz (or copy raw/n) beside target/n, then rename: concurrent runs and interrupted
    ones never see a half-written file."""
    from torchvision.datasets.utils import extract_archive

    gz = raw / f"{n}.gz"
    scratch = Path(tempfile.mkdtemp(dir=target, prefix=".extract-"))
    try:
        if gz.is_file():
            extract_archive(str(gz), str(scratch))
        else:
            shutil.copyfile(raw / n, scratch / n)
        os.replace(scratch / n, target / n)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# what zlib and gzip raise for a truncated or corrupted .gz (BadGzipFile is an OSError, hence named)
GZIP_DAMAGE = (EOFError, zlib.error, gzip.BadGzipFile)


def fetch_again(name: str, root: Path, gz: Path, how: str, reason: str, download: bool) -> None:
    """Replace a damaged .gz by a downloaded copy whose MD5 is checked before it takes the file's place."""
    if not download:
        raise DataError(f"{name}: {gz} is damaged ({reason}); replace it with a good copy ({how}), "
                        f"or set data.download=true to download it again")
    official = dict((url.rsplit("/", 1)[-1], digest) for url, digest in source(name).files).get(gz.name)
    log.warning("%s: %s is damaged (%s); downloading it again", name, gz, reason)
    try:  # another run may have replaced it meanwhile: the official checksum says so
        fetch(name, root, how, lambda: official is not None and file_md5(gz) == official, only=[gz.name])
    except DownloadError as err:
        failed = getattr(err, "reason", err)
        raise DataError(f"{name}: {gz} is damaged ({reason}) and was left as it is: {failed}; "
                        f"replace it with a good copy ({how})") from None


def idx_damage(folder: Path, names: list[str]) -> str | None:
    """The first of the extracted IDX files whose length is not what its header announces, and by how much."""
    for n in names:
        with open(folder / n, "rb") as f:
            head = f.read(4)
            size = f.seek(0, os.SEEK_END)
            if len(head) < 4 or head[:3] != b"\0\0\x08":  # unsigned bytes: MNIST's images and labels
                return f"{folder / n} is not an IDX file of unsigned bytes"
            f.seek(4)
            dims = f.read(4 * head[3])
        expected = 4 + len(dims) + math.prod(int.from_bytes(dims[i:i + 4], "big") for i in range(0, len(dims), 4))
        if len(dims) < 4 * head[3] or size != expected:
            return f"{folder / n} holds {size} bytes where its header announces {expected}"
    return None
