"""The server process's memory: bounded caches, freed memory handed back, and reading it.

The rules and their reasons: ``docs/serving-over-http.md``.
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
