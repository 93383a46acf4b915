"""The simulator's fast path for a replica of a cluster: decode runs brought forward lazily.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

from batchlab.contract import ServingEngine
from batchlab.sim.fast_path import DecodeRuns, predict_decode_steps
from batchlab.plan import Idle
from batchlab.trace import StepRecord


class LazyDecodeRuns(DecodeRuns):
    """``DecodeRuns`` whose predicted steps are brought forward only when someone looks."""

    def __init__(self, engine: ServingEngine) -> None:
        super().__init__(engine)
        self.unapplied: list[StepRecord] = []   # predicted steps not yet brought forward
        self.limit: int | None = None           # the run's last offset (first finish, or blocks)

    def after_step(self, out: StepRecord | Idle) -> None:
        if self.unapplied:
            raise RuntimeError("the engine stepped while predicted steps were still pending "
                               "(call sync first)")
        super().after_step(out)
        self.limit = None

    def recheck(self) -> None:
        """A request arrived: bring the run forward and check its steadiness again next time."""
        self.sync()
        self.limit = None

    def advance(self, now: float, stop_at: float) -> float | None:
        """Predict the run's steps from ``now`` until the first that ends at or after
        ``stop_at`` (or the run's last step); return the new time, or None if none can be (the
        engine steps next, so the predicted steps are brought forward first)."""
        end = self._predict(now, stop_at)
        if end is None:
            self.sync()
        return end

    def _predict(self, now: float, stop_at: float) -> float | None:
        run, engine = self.current_run(), self.engine
        if run is None:
            return None
        if self.limit is None:
            if not self._steady(run):
                return None
            self.limit = self.offset + self._steps_with_room(run)
        predicted = self.offset + len(self.unapplied)
        if predicted >= self.limit:
            return None
        records = predict_decode_steps(run, predicted, now, stop_at, self.limit, len(engine.steps),
                                       engine.backend.step_duration)
        engine.steps.extend(records)
        self.unapplied.extend(records)
        self.num_steps += len(records)
        if predicted + len(records) == run.last_offset:
            self.sync()                          # requests finish: the router must hear of it now
        return records[-1].end

    def sync(self) -> None:
        """Bring the predicted steps forward: tokens, KV growth, and the finish of the run."""
        if not self.unapplied:
            return
        run, records = self.run, self.unapplied
        self.unapplied = []
        self._bring_forward(run, records)
        if self.run is None:                     # the run's last step: its requests finished
            self.limit = None


__all__ = ["LazyDecodeRuns"]
