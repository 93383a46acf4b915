"""vLLM V1's async scheduling as a scheduler: a request arriving during a step joins one step later.

The rules and their reasons: ``docs/predicting-a-deployment.md``.
"""

from __future__ import annotations

from collections.abc import Callable

from batchlab.plan import StepPlan
from batchlab.schedulers import ContinuousBatcher
from batchlab.trace import StepRecord


class AsyncScheduledBatcher(ContinuousBatcher):
    """``ContinuousBatcher`` that admits a request no earlier than the second step after its
    arrival."""

    def __init__(self, *args, last_step: Callable[[], StepRecord | None] = lambda: None,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.last_step = last_step
        self._in_flight: tuple[float, float] | None = None    # the step whose newcomers wait

    def schedule(self, now: float) -> StepPlan:
        last = self.last_step()
        # Planned back to back with the last step, while requests run: that step's arrivals wait.
        self._in_flight = ((last.start, last.end)
                           if last is not None and self.running and now <= last.end else None)
        return super().schedule(now)

    def _admit_waiting(self, step, now: float) -> None:
        if self._in_flight is None:
            return super()._admit_waiting(step, now)
        start, _ = self._in_flight
        waiting, late = self.waiting, []
        while waiting and waiting[-1].arrival_time > start:   # the newest arrivals are at the back
            late.append(waiting.pop())
        super()._admit_waiting(step, now)
        waiting.extend(reversed(late))


__all__ = ["AsyncScheduledBatcher"]
