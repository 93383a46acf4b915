"""Dynamic batching: a batch leaves when it is full or its oldest request has waited long enough.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchlab.checks import check_bool, check_int, check_number
from batchlab.schedulers.request_level import RequestLevelBatcher


@dataclass(frozen=True)
class DynamicBatcherConfig:
    """``max_batch_size``: the most requests in a batch. ``timeout``: seconds the oldest waiting
    request may wait for others before its batch leaves (0: leave with whoever is there).
    ``stream``: release each request when it finishes (True) or the batch when it ends (False)."""

    max_batch_size: int
    timeout: float
    stream: bool = False

    def __post_init__(self) -> None:
        check_int("max_batch_size", self.max_batch_size)
        check_number("timeout", self.timeout, hint="seconds; 0 = leave with whoever is waiting")
        check_bool("stream", self.stream)


class DynamicBatcher(RequestLevelBatcher):
    """Form a batch when ``max_batch_size`` requests wait or the oldest has waited ``timeout``
    seconds.

    Rules:

    - While the server is idle, the timer starts when a request arrives to an empty queue. The
      batch leaves as soon as ``max_batch_size`` requests are waiting, or when the timer ends with
      however many are waiting, whichever comes first.
    - Requests that arrive while a batch runs wait in the queue (nobody joins a running batch).
      When that batch ends, the same rule is applied to the queue as it stands: if it already holds
      ``max_batch_size`` requests they leave at once; otherwise the timer is measured from the
      *oldest waiting request's arrival*, so a request that has already waited ``timeout`` seconds
      leaves immediately with whoever is behind it. (This one rule also covers the idle case: there
      the oldest waiting request is the one that started the timer.)
    - ``timeout = 0`` means "leave with whoever is waiting": every batch leaves as soon as the
      server is free.
    - While waiting for the timer, ``schedule`` returns an empty plan whose ``wake_at`` is the
      timer's end, so the engine can skip ahead to it if nothing arrives first.
    - ``draining`` changes nothing here: the timer always ends, so nothing waits forever (and a
      real server would not know that no more requests are coming).
    - If the KV cache cannot hold the whole batch, it runs with the members that fit (in arrival
      order); the others lead the next batch.
    """

    def __init__(self, max_batch_size: int, timeout: float, stream: bool = False) -> None:
        self.config = DynamicBatcherConfig(max_batch_size, timeout, stream)
        super().__init__()

    @property
    def max_batch_size(self) -> int:
        return self.config.max_batch_size

    @property
    def timeout(self) -> float:
        return self.config.timeout

    def timer_end(self) -> float | None:
        """When the current wait ends: the oldest waiting request's arrival plus ``timeout``."""
        return self.waiting[0].arrival_time + self.config.timeout if self.waiting else None

    def _num_leaving(self, now: float) -> tuple[int, float | None]:
        if not self.waiting:
            return 0, None
        if len(self.waiting) >= self.config.max_batch_size:
            return self.config.max_batch_size, None
        due = self.timer_end()
        if now >= due:
            return len(self.waiting), None
        return 0, due

    def __repr__(self) -> str:
        return (f"DynamicBatcher(max_batch_size={self.max_batch_size}, timeout={self.timeout}, "
                f"stream={self.stream})")
