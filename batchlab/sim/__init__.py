"""The simulator: a backend whose steps take the time a cost model predicts and compute nothing
(``SimBackend``), and its fast path, which predicts runs of plain decode steps in bulk inside the
serving loop (``DecodeRuns``; ``LazyDecodeRuns`` for many engines on one clock). A run gives the
same trace with the fast path or step by step. The rules: ``docs/the-core.md``.
"""

from batchlab.sim.backend import PLACEHOLDER_TOKEN, SimBackend
from batchlab.sim.fast_path import DecodeRuns
from batchlab.sim.lazy_runs import LazyDecodeRuns

__all__ = ["PLACEHOLDER_TOKEN", "DecodeRuns", "LazyDecodeRuns", "SimBackend"]
