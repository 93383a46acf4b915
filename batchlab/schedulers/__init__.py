"""Batching policies: who runs in the next step.

- ``StaticBatcher``: wait for a full batch, run it to its end (``static.py``).
- ``DynamicBatcher``: a batch leaves when full or when a timer ends (``dynamic.py``).
- ``ContinuousBatcher``: re-form the batch every step within a token budget (``continuous.py``).

All follow the contract in ``base.py``; static and dynamic share ``request_level.py``. Each can
promise the simulator's fast path steady decodes (``steady.py``).
"""

from __future__ import annotations

from batchlab.schedulers.base import Scheduler
from batchlab.schedulers.continuous import ContinuousBatcher, ContinuousBatcherConfig
from batchlab.schedulers.dynamic import DynamicBatcher, DynamicBatcherConfig
from batchlab.schedulers.request_level import RequestLevelBatcher
from batchlab.schedulers.static import StaticBatcher, StaticBatcherConfig
from batchlab.schedulers.steady import SteadyDecodes

SCHEDULERS: dict[str, type[Scheduler]] = {
    "static": StaticBatcher,
    "dynamic": DynamicBatcher,
    "continuous": ContinuousBatcher,
}


def make_scheduler(name: str, **kwargs) -> Scheduler:
    """Build a scheduler by name: ``make_scheduler("dynamic", max_batch_size=8, timeout=0.05)``."""
    try:
        cls = SCHEDULERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown scheduler {name!r}; choose one of "
                         f"{sorted(SCHEDULERS)}") from None
    return cls(**kwargs)


__all__ = [
    "Scheduler", "RequestLevelBatcher", "SteadyDecodes",
    "StaticBatcher", "StaticBatcherConfig",
    "DynamicBatcher", "DynamicBatcherConfig",
    "ContinuousBatcher", "ContinuousBatcherConfig",
    "SCHEDULERS", "make_scheduler",
]
