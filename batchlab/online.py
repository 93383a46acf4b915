"""The online driver (``Engine.run_online``): the serving loop on the wall clock, fed by a
thread-safe ``EngineInbox`` (add, abort, stop) and telling a listener each step and each end.

An aborted request ends ABORTED with the reason in ``finish_detail``; ``stop(reason)`` aborts
everything still in flight. The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from dataclasses import dataclass, field

from batchlab.clock import Clock
from batchlab.contract import ServingEngine
from batchlab.listener import EngineListener
from batchlab.loop import Arrivals, run_until
from batchlab.requests import Request
from batchlab.trace import Trace

__all__ = ["EngineInbox", "EngineListener", "InboxArrivals", "InboxCommands", "forget_ended",
           "serve_online"]


@dataclass
class InboxCommands:
    """What the engine takes out of the inbox in one read (in the order they were given)."""

    # (request, perf_counter at add)
    adds: list[tuple[Request, float]] = field(default_factory=list)
    aborts: list[tuple[str, str]] = field(default_factory=list)       # (request_id, reason)
    stop_reason: str | None = None


class EngineInbox:
    """Thread-safe commands for an engine running online (see the module docstring).

    Any thread may call ``add``, ``abort`` and ``stop``; the engine's thread calls ``take`` and
    ``wait``. ``add`` after ``stop`` raises ``RuntimeError`` (the server answers such a request
    itself: it is shutting down).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending = InboxCommands()
        self._stopping = False

    @property
    def stopping(self) -> bool:
        return self._stopping

    def add(self, req: Request) -> None:
        """Submit a fresh request (status WAITING, no tokens). It arrives now."""
        if req.num_computed_tokens or req.output_ids or req.is_done:
            raise ValueError(f"request {req.request_id!r} carries run state; add a fresh request")
        with self._cond:
            if self._stopping:
                raise RuntimeError("the engine is stopping; "
                                   f"request {req.request_id!r} was not added")
            self._pending.adds.append((req, time.perf_counter()))
            self._cond.notify()

    def abort(self, request_id: str, reason: str) -> None:
        """End ``request_id`` early with ``reason`` (no-op if it already ended or is unknown)."""
        if not isinstance(reason, str) or not reason:
            raise ValueError(f"reason={reason!r}; an abort must say why (a non-empty string)")
        with self._cond:
            self._pending.aborts.append((request_id, reason))
            self._cond.notify()

    def stop(self, reason: str) -> None:
        """Stop admitting, abort every request in flight with ``reason``, end the loop."""
        if not isinstance(reason, str) or not reason:
            raise ValueError(f"reason={reason!r}; a stop must say why (a non-empty string)")
        with self._cond:
            if not self._stopping:
                self._stopping = True
                self._pending.stop_reason = reason
            self._cond.notify()

    # --- the engine's side ----------------------------------------------------------------------
    def take(self) -> InboxCommands:
        """Every command given since the last ``take``."""
        with self._cond:
            commands, self._pending = self._pending, InboxCommands()
            return commands

    def wait(self, timeout: float | None) -> None:
        """Block until a command is given or ``timeout`` seconds pass (None: no limit)."""
        with self._cond:
            p = self._pending
            if p.adds or p.aborts or p.stop_reason is not None:
                return
            self._cond.wait(timeout)


# --- the driver -----------------------------------------------------------------------------------
class InboxArrivals(Arrivals):
    """The loop's arrivals from an inbox: its adds, aborts and stop, applied at each pass."""

    def __init__(self, inbox: EngineInbox) -> None:
        self.inbox = inbox

    def admit(self, engine: ServingEngine, now: float) -> None:
        commands = self.inbox.take()
        perf_now = time.perf_counter()
        requests = engine.requests
        for req, added_at in commands.adds:
            # It arrived when it was added (on this clock), never before the previous arrival.
            previous = next(reversed(requests.values())).arrival_time if requests else 0.0
            req.arrival_time = max(now - (perf_now - added_at), previous, 0.0)
            engine.add_request(req, now)
        aborts = commands.aborts
        if commands.stop_reason is not None:
            aborts = aborts + [(rid, commands.stop_reason) for rid, r in requests.items()
                               if not r.is_done]
        if aborts and any([engine.abort(rid, why, now) for rid, why in aborts]):
            # aborted running requests leave the scheduler and free their KV
            engine.release_ended(now)
        self.exhausted = self.inbox.stopping

    def wait(self, clock: Clock, now: float, target: float) -> float:
        """Idle until a command is given or the scheduler's timer is due."""
        self.inbox.wait(None if target == math.inf else max(0.0, target - now))
        return clock.now()


def serve_online(engine: ServingEngine, inbox: EngineInbox, listener: EngineListener) -> Trace:
    """Run ``engine`` on what ``inbox`` is given until it is stopped and nothing is in flight."""
    if engine.clock.name != "wall":
        raise ValueError(f"run_online needs the wall clock (Engine(..., clock='wall')), not "
                         f"{engine.clock.name!r}: requests arrive in real time")
    if not isinstance(inbox, EngineInbox):
        raise ValueError(f"inbox={inbox!r}; must be an EngineInbox")
    wall_start = time.perf_counter()
    run_until(engine, InboxArrivals(inbox), engine.start(listener))
    return engine.finish(wall_seconds=time.perf_counter() - wall_start)


def forget_ended(engine: ServingEngine, keep: int) -> tuple[int, int]:
    """A long-running server's memory: keep the engine's run record to its last ``keep`` ended
    requests, and the steps and preemptions since the oldest request kept; returns how many
    requests and preemptions were dropped."""
    requests, times = engine.requests, engine.release_times     # in arrival order
    ended = [rid for rid, r in requests.items() if r.is_done and times.get(rid) is not None]
    if len(ended) <= keep:
        return 0, 0
    for rid in ended[:len(ended) - keep]:                       # the oldest arrivals go first
        del requests[rid], times[rid]
    oldest = next(iter(requests.values())).arrival_time
    del engine.steps[:bisect.bisect_left(engine.steps, oldest, key=lambda s: s.start)]
    log = engine.scheduler.preemptions
    num_old = bisect.bisect_left(log, oldest, key=lambda p: p.time)
    del log[:num_old]
    return len(ended) - keep, num_old
