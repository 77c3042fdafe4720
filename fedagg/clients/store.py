"""Per-client state by client id, bounded in host memory and kept out of checkpoints.

Some methods keep a tensor per client id across rounds: SCAFFOLD's control variate c_k,
FedDyn's gradient state g_k, the local momentum of `client.keep_optimizer_state`, an
error-feedback residual. At FEMNIST scale (3,597 writers, a 6.6M-parameter CNN) that is
26 MB a client, ~94 GB for all of them: more than host memory, and far more than a
checkpoint written every few rounds should copy. `ClientStore` holds them instead:

    store = ClientStore()                 # one per kind of state
    store.put(client_id, tensor)          # keeps a CPU copy; the caller may reuse its tensor
    store.get(client_id)                  # that tensor (CPU; do not change it in place), or None
    client_id in store, len(store), store.ids(), store.items()   # every stored id / (id, tensor)
    store[client_id], store[client_id] = tensor, iter(store), store.keys()   # as for a dict
    state = store.state_dict()            # for a checkpoint: small, see below
    store.load_state_dict(state)          # on resume: exactly the state of that checkpoint
    store.attach(folder)                  # the run loop gives it a folder in the run directory

Tensors stay in memory, most recently used first, up to `memory_budget` bytes; beyond
that the least recently used go to files in the attached folder (one file per version
of a client's tensor, written once and never changed). A checkpoint holds, per id, which
file version it had, and only inline the tensors not yet in a file while they total less
than `inline_limit` bytes (a small run's checkpoint stays one self-contained file); past
that it writes them out first. A resumed run therefore reads each id's tensor as of its
checkpoint, never one written after it (files newer than the checkpoint are deleted on
resume). Files that neither the live state nor the last three checkpoints refer to are
removed as new versions replace them (three: the checkpoint being written, checkpoint.pt
and checkpoint.prev.pt, which stays the fallback until the new one is complete). Without
an attached folder (a unit test, a notebook) everything stays in memory and in the
checkpoint, as before.

Measured with scripts/client_state_memory.py (cnn_femnist's size, 26 MB a client): the
store's own memory stays at its budget, but glibc keeps freed blocks of that size for
reuse instead of returning them, so the process's peak RSS can sit a few GB above it;
MALLOC_MMAP_THRESHOLD_=65536 in the environment makes it return them (500 MB budget:
peak RSS 2.0 GB by default, 1.2 GB with it).
"""

from __future__ import annotations

import os
from collections import OrderedDict, deque
from pathlib import Path

import torch
from torch import Tensor

MEMORY_BUDGET = 2 << 30  # bytes of client state kept in host memory per store before spilling to files
INLINE_LIMIT = 64 << 20  # bytes of not-yet-spilled state a checkpoint may hold itself


class ClientStore:
    def __init__(self, memory_budget: int | None = None, inline_limit: int | None = None) -> None:
        # the module's values when not given, read now: a test or a notebook may change them
        self.memory_budget = int(MEMORY_BUDGET if memory_budget is None else memory_budget)
        self.inline_limit = int(INLINE_LIMIT if inline_limit is None else inline_limit)
        self._memory: OrderedDict[int, Tensor] = OrderedDict()  # least recently used first
        self._bytes = 0  # of the tensors in _memory
        self._dirty: set[int] = set()  # ids whose tensor in memory is newer than any file of theirs
        self._files: dict[int, int] = {}  # id -> version of its newest file
        self._version = 0  # the last file version written (one counter for all ids)
        self._folder: Path | None = None
        self._on_disk: set[tuple[int, int]] = set()  # (id, version) files present
        self._kept: deque[set[tuple[int, int]]] = deque(maxlen=3)  # files the latest checkpoints refer to

    # -- get / put -----------------------------------------------------------------------
    def get(self, client_id: int) -> Tensor | None:
        client_id = int(client_id)
        if client_id in self._memory:
            self._memory.move_to_end(client_id)
            return self._memory[client_id]
        if client_id not in self._files:
            return None
        value = torch.load(self._path(client_id, self._files[client_id]), weights_only=True)
        self._hold(client_id, value)
        self._spill()
        return value

    def put(self, client_id: int, value: Tensor) -> None:
        client_id = int(client_id)
        self._drop(client_id)
        self._hold(client_id, value.detach().to("cpu", copy=True))
        self._dirty.add(client_id)
        self._spill()

    # dict-like spellings of the same, so code written for a dict of tensors reads the same
    def __getitem__(self, client_id: int) -> Tensor:
        value = self.get(client_id)
        if value is None:
            raise KeyError(client_id)
        return value

    def __setitem__(self, client_id: int, value: Tensor) -> None:
        self.put(client_id, value)

    def __iter__(self):
        return iter(self.ids())

    def keys(self) -> set[int]:
        return set(self.ids())

    def __contains__(self, client_id) -> bool:
        return int(client_id) in self._memory or int(client_id) in self._files

    def __len__(self) -> int:
        return len(self._memory.keys() | self._files.keys())

    def ids(self) -> list[int]:
        return sorted(self._memory.keys() | self._files.keys())

    def items(self):
        """(id, tensor) for every id, in id order (reads spilled ones back one at a time)."""
        for client_id in self.ids():
            yield client_id, self.get(client_id)

    @property
    def memory_bytes(self) -> int:
        """Bytes of client state held in host memory now (at most the budget, or one tensor past it)."""
        return self._bytes

    # -- the run's folder and checkpoints -------------------------------------------------
    def attach(self, folder: Path) -> None:
        """Spill to `folder` from now on (created when the first file is written)."""
        self._folder = Path(folder)
        self._spill()

    def state_dict(self) -> dict:
        pending = sum(self._memory[i].nbytes for i in self._dirty)
        if self._folder is not None and pending > self.inline_limit:
            for client_id in sorted(self._dirty):
                self._write(client_id)
        inline = {i: self._memory[i].clone() for i in sorted(self._dirty)}
        files = {i: v for i, v in self._files.items() if i not in inline}
        self._kept.append({(i, v) for i, v in files.items()})
        self._collect()
        return {"inline": inline, "files": files, "version": self._version}

    def load_state_dict(self, state: dict) -> None:
        if "inline" not in state:  # a checkpoint from before the store: {client id: tensor}
            state = {"inline": state, "files": {}, "version": 0}
        self._memory, self._bytes, self._dirty = OrderedDict(), 0, set()
        self._files, self._version = {int(i): int(v) for i, v in state["files"].items()}, int(state["version"])
        for client_id, value in state["inline"].items():
            self._hold(int(client_id), value.to("cpu", copy=True))
            self._dirty.add(int(client_id))
        present = self._scan()
        for client_id, version in [f for f in present if f[1] > self._version]:
            self._path(client_id, version).unlink()  # written after the checkpoint: never to be read
        self._on_disk = {f for f in present if f[1] <= self._version}
        missing = {(i, v) for i, v in self._files.items()} - self._on_disk
        if missing:
            client_id, version = min(missing)
            raise ValueError(f"{self._path(client_id, version)} is missing: the checkpoint needs the client state "
                             "it refers to; start the run again with overwrite=true")
        # the files present may include those of checkpoint.prev.pt: keep them until two more checkpoints
        self._kept = deque([set(self._on_disk), {(i, v) for i, v in self._files.items()}], maxlen=3)
        self._spill()

    # -- inside --------------------------------------------------------------------------
    def _hold(self, client_id: int, value: Tensor) -> None:
        self._memory[client_id] = value
        self._bytes += value.nbytes

    def _drop(self, client_id: int) -> None:
        value = self._memory.pop(client_id, None)
        if value is not None:
            self._bytes -= value.nbytes
        self._dirty.discard(client_id)

    def _spill(self) -> None:
        """Move the least recently used tensors to files while memory holds more than the budget."""
        if self._folder is None:
            return
        while self._bytes > self.memory_budget and len(self._memory) > 1:
            client_id = next(iter(self._memory))
            if client_id in self._dirty:
                self._write(client_id)
            self._drop(client_id)

    def _write(self, client_id: int) -> None:
        self._version += 1
        path = self._path(client_id, self._version)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(self._memory[client_id], tmp)
        os.replace(tmp, path)
        old = self._files.get(client_id)
        self._files[client_id] = self._version
        self._on_disk.add((client_id, self._version))
        self._dirty.discard(client_id)
        if old is not None and not any((client_id, old) in kept for kept in self._kept):
            self._remove((client_id, old))

    def _collect(self) -> None:
        """Remove files that neither the live state nor the kept checkpoints refer to."""
        live = {(i, v) for i, v in self._files.items()}
        for f in sorted(self._on_disk - live - set().union(*self._kept)):
            self._remove(f)

    def _remove(self, f: tuple[int, int]) -> None:
        self._path(*f).unlink(missing_ok=True)
        self._on_disk.discard(f)

    def _path(self, client_id: int, version: int) -> Path:
        return self._folder / f"{client_id}.{version}.pt"

    def _scan(self) -> set[tuple[int, int]]:
        if self._folder is None or not self._folder.is_dir():
            return set()
        found = set()
        for path in self._folder.glob("*.pt"):
            client_id, version = path.stem.split(".")
            found.add((int(client_id), int(version)))
        return found
