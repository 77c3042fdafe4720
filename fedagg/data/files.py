"""Where dataset files live (`data.root`, the cache) and the error for files the user must fix.

`DataError` is a ValueError, so `fedagg.run` reports it as a user error (one line, exit
status 2) and not as a bug with a traceback: a folder that is a file, a damaged file, an
unusable cache.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


class DataError(ValueError):
    """Dataset files or folders that cannot be used as they are; the message names them and the remedy."""


def file_in_the_way(path: Path) -> Path | None:
    """The file that keeps `path` from being (or becoming) a folder: `path` itself or one of its parents."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


def data_root(root: str) -> Path:
    """`data.root` as an absolute folder path; a DataError when a file stands where the folder must be."""
    path = Path(root).expanduser().resolve()
    blocker = file_in_the_way(path)
    if blocker is not None:
        where = "is a file" if blocker == path else f"is inside {blocker}, which is a file"
        raise DataError(f"data.root={root} {where}; data.root must be a folder (one that holds the datasets, "
                        f"or where they can be downloaded)")
    return path


def cache_dir() -> Path:
    """Where decoded or extracted copies go when the data folder itself is read-only."""
    return Path(os.environ.get("FEDAGG_CACHE") or Path.home() / ".cache" / "fedagg").expanduser()


def cache_folder(sub: str = "") -> Path:
    """`cache_dir() / sub`, created; a DataError naming FEDAGG_CACHE when it cannot be."""
    folder = cache_dir() / sub
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        blocker = file_in_the_way(folder)
        reason = f"{blocker} is a file" if blocker is not None else f"{err.strerror}: {err.filename}"
        where = (f"FEDAGG_CACHE={os.environ['FEDAGG_CACHE']}" if os.environ.get("FEDAGG_CACHE")
                 else f"the cache folder {cache_dir()}")
        raise DataError(f"{where} cannot be used ({reason}); set FEDAGG_CACHE to a folder fedagg can write "
                        f"(or unset it for ~/.cache/fedagg)") from None
    return folder


def md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
