"""The serving loop: admit what has arrived, take a step, and wait when there is nothing to run.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from batchlab.clock import Clock
from batchlab.contract import EngineError, ServingEngine
from batchlab.plan import Idle
from batchlab.requests import Request
from batchlab.schedulers.base import Scheduler
from batchlab.trace import StepRecord


class Arrivals:
    """Where a loop's requests come from. ``admit`` hands the engine every request that has
    arrived by ``now``; ``next_time`` is when the next one arrives, if that is known (else inf);
    ``exhausted`` says that none will arrive any more; ``wait`` idles until ``target`` (inf: until
    a request comes) and returns the new time."""

    exhausted: bool = False

    def admit(self, engine: ServingEngine, now: float) -> None:
        pass

    def next_time(self) -> float:
        return math.inf

    def wait(self, clock: Clock, now: float, target: float) -> float:
        return clock.wait_until(target)


class Workload(Arrivals):
    """A known list of requests, sorted by arrival (the offline driver's)."""

    def __init__(self, requests: Sequence[Request]) -> None:
        self.requests, self.next = requests, 0

    def admit(self, engine: ServingEngine, now: float) -> None:
        requests, i = self.requests, self.next
        while i < len(requests) and requests[i].arrival_time <= now:
            engine.add_request(requests[i], now)
            i += 1
        self.next, self.exhausted = i, i == len(requests)

    def next_time(self) -> float:
        return self.requests[self.next].arrival_time if self.next < len(self.requests) else math.inf


class DecodeRunPredictor(Protocol):
    """The simulator's fast path (``sim.fast_path.DecodeRuns``), as the loop calls it."""

    def advance(self, now: float, stop_at: float) -> float | None: ...
    def after_step(self, out: StepRecord | Idle) -> None: ...


def run_until(engine: ServingEngine, arrivals: Arrivals, now: float, until: float = math.inf,
              fast: DecodeRunPredictor | None = None) -> float:
    """Serve from ``now`` until a step ends at or past ``until``, or until the work is done
    (nothing left to arrive, nothing pending, no timer set); return the time reached."""
    scheduler, clock = engine.scheduler, engine.clock
    admit, next_time, step = arrivals.admit, arrivals.next_time, engine.step   # (looked up once)
    while now < until:
        now = clock.now()
        admit(engine, now)
        if arrivals.exhausted and not scheduler.draining:
            scheduler.start_draining()
        horizon = min(next_time(), until)
        if fast is not None and (end := fast.advance(now, horizon)) is not None:
            now = clock.wait_until(end)      # a run of predicted decode steps took until ``end``
            continue
        out = step(now)
        if fast is not None:
            fast.after_step(out)
        if not isinstance(out, Idle):
            now = out.end
            continue
        target = min(horizon, _timer(scheduler, out, now))
        if target == math.inf and arrivals.exhausted:
            check_nothing_pending(engine)
            return now
        now = arrivals.wait(clock, now, target)
    return now


def _timer(scheduler: Scheduler, out: Idle, now: float) -> float:
    """When the idle scheduler asked to be woken (inf: never); it must be in the future."""
    if out.wake_at is None:
        return math.inf
    if not out.wake_at > now:
        raise EngineError(f"{scheduler!r} planned nothing at now={now} but set "
                          f"wake_at={out.wake_at}, "
                          "which is not in the future; it would never make progress")
    return out.wake_at


def check_nothing_pending(engine: ServingEngine) -> None:
    """With nothing left to arrive and no timer, a scheduler that still holds work is stuck."""
    if engine.scheduler.has_pending():
        stuck = [rid for rid, r in engine.requests.items() if not r.is_done]
        raise EngineError(f"deadlock: {engine.scheduler!r} holds {len(stuck)} unfinished requests "
                          f"(first: {stuck[:5]}) but planned nothing, set no timer, and no request "
                          "is left to arrive")


@contextmanager
def gc_paused() -> Iterator[None]:
    """A large run creates millions of small objects; Python's cyclic garbage collector would scan
    them all again and again (about a third of a simulation's time), so it is paused for the run.
    The first collection after it scans the run's survivors once and frees the few cycles it left
    (moving them to the oldest generation instead, unscanned, kept gigabytes of those alive)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


__all__ = ["Arrivals", "Workload", "check_nothing_pending", "gc_paused", "run_until"]
