"""The online driver: a server's loop, with requests added and aborted while it runs.

Offline, ``Engine.run(workload)`` knows every request and its arrival time in advance. A server
does not: requests come in from other threads (HTTP handlers) while the loop is running, clients
go away, and the server is stopped at some point. ``Engine.run_online(inbox, listener)`` drives
the same ``Engine.step`` on the wall clock (``serve_online`` below), with two differences:

- At the top of every pass it reads an ``EngineInbox``: a thread-safe list of commands (``add``
  a request, ``abort`` one, ``stop``). An added request arrives at the moment ``add`` was called
  (its ``arrival_time`` is set then, on the engine's clock). When there is nothing to run, the
  loop waits on the inbox (until a command comes, or the scheduler's timer is due) instead of
  ending.
- It tells a listener (``listener.py``) what happens as it happens: ``on_token`` for every token
  the moment its step ends, ``on_end`` when a request's response is complete (finished and
  released, rejected, or aborted). A server streams from these.

Aborts. An aborted request ends with status ABORTED, ``finish_reason`` ABORT and the reason in
``finish_detail``. A waiting one leaves the queue at once; a running one leaves the scheduler,
which frees its KV space, before the next step is planned. Its tokens so far stay in the trace.
``stop(reason)`` stops admission (later ``add``s are rejected with the reason) and aborts
everything still in flight with that reason, then the loop returns its trace.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from batchlab.listener import EngineListener
from batchlab.plan import Idle
from batchlab.requests import Request

if TYPE_CHECKING:   # the engine imports this driver, not the other way round
    from batchlab.engine import Engine
    from batchlab.trace import Trace

__all__ = ["EngineInbox", "EngineListener", "InboxCommands", "serve_online"]


@dataclass
class InboxCommands:
    """What the engine takes out of the inbox in one read (in the order they were given)."""

    adds: list[tuple[Request, float]] = field(default_factory=list)   # (request, perf_counter at add)
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
                raise RuntimeError(f"the engine is stopping; request {req.request_id!r} was not added")
            self._pending.adds.append((req, time.perf_counter()))
            self._cond.notify()

    def abort(self, request_id: str, reason: str) -> None:
        """End ``request_id`` early with ``reason`` (no-op if it has already ended or is unknown)."""
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


# --- the driver ------------------------------------------------------------------------------------
def serve_online(engine: "Engine", inbox: EngineInbox, listener: EngineListener) -> "Trace":
    """Run ``engine`` on what ``inbox`` is given until it is stopped and nothing is in flight."""
    wall_start = time.perf_counter()
    now = engine.start(listener)
    while True:
        now = engine.clock.now(now)
        if not _read_inbox(engine, inbox, now):
            return engine.finish(wall_seconds=time.perf_counter() - wall_start)
        out = engine.step(now)
        if isinstance(out, Idle):        # idle: wait for a command, or the scheduler's timer
            inbox.wait(None if out.wake_at is None else out.wake_at - now)
        else:
            now = out.end


def _read_inbox(engine: "Engine", inbox: EngineInbox, now: float) -> bool:
    """Admit added requests, apply aborts and a stop. False when the loop should end (stopped
    and nothing left in flight)."""
    commands = inbox.take()
    perf_now = time.perf_counter()
    requests = engine.requests
    for req, added_at in commands.adds:
        # It arrived when it was added (on this clock), never before the previous arrival.
        previous = next(reversed(requests.values())).arrival_time if requests else 0.0
        req.arrival_time = max(now - (perf_now - added_at), previous, 0.0)
        engine.add_request(req, now)
    aborts = commands.aborts
    if commands.stop_reason is not None:
        aborts = aborts + [(rid, commands.stop_reason) for rid, r in requests.items() if not r.is_done]
    if aborts and any([engine.abort(rid, why, now) for rid, why in aborts]):
        # Aborted running requests leave the scheduler (and free their KV) now, as after a step.
        engine.release(engine.scheduler.remove_ended(), now)
    return not (inbox.stopping and not engine.scheduler.has_pending())
