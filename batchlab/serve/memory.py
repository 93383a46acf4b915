"""The server process's memory: bounded caches, freed memory handed back, and reading it.

Why a server needs this. Each engine step multiplies a matrix of as many rows as the step has
tokens, and under live traffic that number changes from step to step. On a CPU the course's
projections run through oneDNN (pre-packed weights), and PyTorch's oneDNN layer (ideep) and
oneDNN itself cache per-shape state, up to 1,024 entries each, some of them megabytes: a server
that meets new step sizes for hours grows by gigabytes before those caches are full. On top,
glibc keeps the blocks freed by tensors of sizes it has seen. Measured on this course's VM:

- 600 projections of distinct row counts, in a bare process: resident memory +1.95 GB; with
  ``malloc_trim(0)`` every 100: +0.40 GB; with both caches bounded to 16 entries as well: +0.03 GB.
- ``scripts/soak_server.py`` (20,000 short mixed requests, 2,000 of them warm-up) with the trim
  alone: +212 MB after warm-up, still growing slowly; with the caches bounded to 128 entries as
  well (6,000 requests after warm-up): +7.8 MB, at no loss of throughput.

So ``python -m batchlab.serve`` bounds both caches (``bound_shape_caches``, before the model's
first step; a value already in the environment wins) and trims every ``TRIM_INTERVAL_S``
seconds (``release_free_memory``, off the event loop: ctypes releases the GIL).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

TRIM_INTERVAL_S = 10.0
SHAPE_CACHE_ENTRIES = 128
# PyTorch's oneDNN layer (ideep) and oneDNN's primitive cache; both read when first used.
SHAPE_CACHE_VARIABLES = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")


def bound_shape_caches(entries: int = SHAPE_CACHE_ENTRIES) -> dict[str, str]:
    """Cap the per-shape caches of this process (unless the environment already does); returns
    the values in force. Call it before the process's first matrix product."""
    for name in SHAPE_CACHE_VARIABLES:
        os.environ.setdefault(name, str(entries))
    return {name: os.environ[name] for name in SHAPE_CACHE_VARIABLES}


def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


_LIBC = _libc()


def release_free_memory() -> bool:
    """Return the allocator's free memory to the system (glibc's ``malloc_trim(0)``); False where
    there is no glibc (macOS, musl), and then nothing is done."""
    if _LIBC is None:
        return False
    _LIBC.malloc_trim(0)
    return True


def rss_mb(pid: int | None = None) -> float:
    """Resident memory of a process (this one by default) in MB, from /proc (Linux)."""
    for line in Path(f"/proc/{pid or os.getpid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS line for process {pid or os.getpid()}")
