"""glibc allocator settings for the CPU feature pass and training loops (one call, idempotent).

A ViT or CNN forward at batch 32-128 makes activations of tens of MB. Above glibc's mmap threshold
(128 KB, growing only up to 32 MB) every such buffer is a fresh ``mmap`` that the kernel
zero-fills page by page and unmaps on free, so the next batch faults it in again: measured, ~40 %
of the pass's CPU time was kernel time. Raising the mmap threshold to 32 MB, keeping freed memory
(trim threshold 1 GB) and growing the heap in 256 MB steps lets the pass reuse the same pages —
the numbers are unchanged (the same kernels on the same data; benchmarks/bench_features.py checks
bit-identity). The process keeps up to ~1 GB of freed heap instead of returning it to the system.

Nothing happens off glibc, when ``$LAB_MALLOC=default`` (keep glibc's defaults), or when the user
set any ``MALLOC_*`` variable themselves (theirs win).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

ENABLED = os.environ.get("LAB_MALLOC", "tuned") != "default"
# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
SETTINGS = {_M_MMAP_THRESHOLD: 32 << 20, _M_TRIM_THRESHOLD: 1 << 30, _M_TOP_PAD: 256 << 20}
_done = False


def tune_allocator() -> bool:
    """Apply :data:`SETTINGS` once per process; True if they are in effect."""
    global _done
    if _done or not ENABLED or any(k.startswith("MALLOC_") for k in os.environ):
        return _done
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):   # not glibc (macOS, musl): nothing to tune
        return False
    _done = all(mallopt(k, v) == 1 for k, v in SETTINGS.items())
    return _done
