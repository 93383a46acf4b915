"""The engine's two clocks: virtual (time is what the steps report) and wall (time is real).

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

from batchlab.backends.base import StepResult
from batchlab.checks import check_choice, check_number

CLOCKS = ("virtual", "wall")


class Clock(ABC):
    """Where ``now`` comes from, how the engine waits, and how a step is timed. A clock keeps its
    own time: ``start`` a run, read ``now()``, ``wait_until`` a target, and time each step by
    calling ``begin_step`` before the backend runs it and ``end_step`` with its result."""

    name: str

    @abstractmethod
    def start(self) -> float:
        """Begin a run; returns ``now`` (0.0)."""

    @abstractmethod
    def now(self) -> float:
        """The current time, in seconds since the run began."""

    @abstractmethod
    def wait_until(self, target: float) -> float:
        """Idle until ``target`` (nothing to run); returns the new ``now``."""

    @abstractmethod
    def begin_step(self) -> float:
        """A step starts; returns its start time."""

    @abstractmethod
    def end_step(self, result: StepResult) -> float:
        """The step's backend returned ``result``; returns the step's duration (the clock is then
        at the step's end)."""


def _checked_duration(result: StepResult) -> float:
    """The step's duration as reported by the backend, checked: finite seconds >= 0."""
    check_number("StepResult.duration", result.duration,
                 hint="seconds the backend reports for a step")
    return float(result.duration)


class VirtualClock(Clock):
    """Time advances by each step's reported duration and jumps over idle gaps."""

    name = "virtual"

    def __init__(self) -> None:
        self._t = 0.0

    def start(self) -> float:
        self._t = 0.0
        return 0.0

    def now(self) -> float:
        return self._t                       # nothing happens between steps on this clock

    def wait_until(self, target: float) -> float:
        self._t = max(self._t, target)       # skip the gap: no real waiting
        return self._t

    def begin_step(self) -> float:
        return self._t

    def end_step(self, result: StepResult) -> float:
        duration = _checked_duration(result)
        self._t += duration
        return duration


class WallClock(Clock):
    """Real time since the run began; see the module docstring."""

    name = "wall"

    def __init__(self) -> None:
        self._t0 = time.perf_counter()
        self._step_start = 0.0

    def start(self) -> float:
        self._t0 = time.perf_counter()
        return 0.0

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def wait_until(self, target: float) -> float:
        delay = target - self.now()
        if delay > 0:
            time.sleep(delay)
        return self.now()

    def begin_step(self) -> float:
        self._step_start = self.now()
        return self._step_start

    def end_step(self, result: StepResult) -> float:
        reported = _checked_duration(result)
        elapsed = self.now() - self._step_start
        if reported > elapsed:
            time.sleep(reported - elapsed)   # a simulated step plays back at its predicted length
        return self.now() - self._step_start


def make_clock(clock: str | Clock) -> Clock:
    """``"virtual"`` or ``"wall"`` (or a ``Clock`` instance) → a clock object."""
    if isinstance(clock, Clock):
        return clock
    check_choice("clock", clock, CLOCKS, hint="or a Clock instance")
    return VirtualClock() if clock == "virtual" else WallClock()
