"""Keep the memory a training step frees for the next step (glibc's malloc on Linux).

A stacked step of the parallel engine on the CPU allocates tens of MB of activations and
gradients and frees them all at its end. glibc gives memory back to the kernel when more
than its trim threshold lies free at the top of the heap (by default twice the largest
block it has seen, at most 64 MB), and blocks above its mmap threshold go straight back;
the next step then takes every page again, each one a page fault the kernel fills with
zeros. On cross_device (scripts/bench.py) that was ~110,000 faults a round and a fifth of
the engine's CPU time. Fixing both thresholds keeps up to 1 GiB of freed memory in the
process: the resident memory stays at its peak instead of falling between steps, and the
peak itself does not change.
"""

from __future__ import annotations

import ctypes
import logging
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
TRIM_BYTES = 1 << 30  # free memory at the heap's top kept before any goes back to the kernel
MMAP_BYTES = 32 << 20  # blocks up to this come from the heap, so they are kept too (glibc's largest allowed value)
log = logging.getLogger(__name__)
_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Set glibc's thresholds once per process; False where the C library is not glibc (nothing changes)."""
    global _applied
    if _applied is None:
        _applied = _mallopt()
        log.debug("malloc keeps freed memory: %s", _applied)
    return _applied


def _mallopt() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
    except (OSError, AttributeError):  # a C library without mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; the mmap threshold first: setting either stops glibc adjusting both
    return mallopt(M_MMAP_THRESHOLD, MMAP_BYTES) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_BYTES) == 1
