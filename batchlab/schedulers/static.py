"""Static batching: wait for a full batch, run it to the end, then take the next one.

The oldest way to batch a model: collect exactly ``batch_size`` requests, run them together until
the last one has produced all its tokens, and only then look at the queue again. It keeps the
batch full when traffic is heavy, but a request may wait a long time for the batch to fill, and
the whole batch waits for its slowest member. The shared request-level rules (admission, the
first step, held slots, release) are in ``request_level.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchlab.checks import check_bool, check_int
from batchlab.schedulers.request_level import RequestLevelBatcher


@dataclass(frozen=True)
class StaticBatcherConfig:
    """``batch_size``: how many requests a batch waits for. ``stream``: release each request when it
    finishes (True) or the whole batch when it ends (False, a non-streaming server)."""

    batch_size: int
    stream: bool = False

    def __post_init__(self) -> None:
        check_int("batch_size", self.batch_size)
        check_bool("stream", self.stream)


class StaticBatcher(RequestLevelBatcher):
    """Run batches of exactly ``batch_size`` requests, one batch at a time.

    Rules:

    - A batch leaves the queue only when ``batch_size`` requests are waiting: the 7th request of a
      batch of 8 waits, however long, until the 8th arrives.
    - The one exception: once the engine says no more requests will come (``draining``), the
      requests still waiting leave as a final partial batch instead of waiting forever.
    - While a batch runs nobody joins it; it ends when every member has finished. Its KV space is
      freed then and the next batch may start at the very next step.
    - If the KV cache cannot hold a full batch, the batch runs with the members that fit (taken in
      arrival order); the others lead the next batch.
    - ``stream=False`` (default): each response is handed back when its batch ends.
      ``stream=True``: each response streams, so it is complete when the request finishes.
    """

    def __init__(self, batch_size: int, stream: bool = False) -> None:
        self.config = StaticBatcherConfig(batch_size, stream)
        super().__init__()

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    def _num_leaving(self, now: float) -> tuple[int, float | None]:
        # No timer: only an arrival (or draining) can change the answer, so wake_at is None.
        if len(self.waiting) >= self.config.batch_size:
            return self.config.batch_size, None
        if self.draining and self.waiting:
            return len(self.waiting), None
        return 0, None

    def __repr__(self) -> str:
        return f"StaticBatcher(batch_size={self.batch_size}, stream={self.stream})"
