"""Everything the server reads from the engine's insides, in one place.

The HTTP side never touches the scheduler, the KV cache or the engine's run directly; it goes
through the functions here, so a change inside the engine is answered by a change in this file:

- ``end_state(req)``: how a request ended (the API's finish reason and the engine's words);
- ``read_engine_stats(scheduler, kv)``: the queue and KV-cache numbers ``/metrics`` shows;
- ``new_preemptions(scheduler, seen)``: preemptions logged since the last look;
- ``new_steps(engine, last)``: engine steps run since the last one looked at;
- ``run_online_bounded(engine, inbox, listener, window)``: ``Engine.run_online`` whose run
  forgets its oldest ended requests (``TraceWindow``), so a server that runs for weeks does not
  keep every request it ever served.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from batchlab.checks import check_int
from batchlab.online import forget_ended
from batchlab.requests import Request, RequestStatus

API_FINISH_REASONS = ("length", "stop")


# --- how a request ended -----------------------------------------------------------------------------
@dataclass(frozen=True)
class EndState:
    """``status``: "finished", "aborted" or "rejected". ``finish_reason``: the API's ("length",
    "stop", or "abort" for anything that did not finish). ``detail``: the engine's own words."""

    status: str
    finish_reason: str
    detail: str | None


def _text(value) -> str | None:
    return value.value if isinstance(value, Enum) else value


def end_state(req: Request) -> EndState:
    """The one place the server reads a request's end (status, finish reason, why)."""
    status = _text(req.status)
    reason = _text(req.finish_reason)
    detail = _text(req.finish_detail) or reason   # the engine's explanation
    if req.status is RequestStatus.FINISHED and reason in API_FINISH_REASONS:
        return EndState(status, reason, detail)
    return EndState(status, "abort", detail)


# --- the numbers /metrics reads ------------------------------------------------------------------
@dataclass(frozen=True)
class EngineStats:
    """The engine's state at one moment (read from another thread: each number is a single read)."""

    num_running: int
    num_waiting: int
    kv_used_tokens: int
    kv_capacity_tokens: int
    prefix_cache_hit_tokens: int       # prompt tokens found in the prefix cache, over the server's life


def read_engine_stats(scheduler, kv) -> EngineStats:
    """Running and waiting requests (request-level batchers: the batch's members run), KV usage,
    prefix-cache hits (paged KV with prefix caching; 0 otherwise)."""
    return EngineStats(len(scheduler.running_requests()), len(scheduler.waiting), kv.used_tokens,
                       kv.capacity_tokens, kv.num_hit_tokens)


def new_preemptions(scheduler, seen: int) -> list:
    """Preemption records logged after the first ``seen`` (``PreemptionRecord``: request_id, time,
    num_computed_tokens, num_output_tokens)."""
    log = scheduler.preemptions
    return list(log[seen:]) if len(log) > seen else []


def new_steps(engine, last) -> list:
    """The engine's steps after ``last`` (a ``StepRecord`` from an earlier call, or None): walks
    back from the newest, so a call costs the new steps. If the trace window dropped ``last``, every
    step kept is newer than it (the window drops the oldest steps), and all are returned."""
    steps = engine.steps
    i = len(steps)
    while i > 0 and steps[i - 1] is not last:
        i -= 1
    return steps[i:]


# --- a bounded memory for a long-running server ---------------------------------------------------
class TraceWindow:
    """Keeps the engine's run to the last ``keep`` ended requests (and the steps and preemptions
    since the oldest of them). Trimmed on the engine's thread, between steps, every ``keep // 8``
    ends, so the work is a few operations per request."""

    def __init__(self, keep: int) -> None:
        check_int("keep", keep, 1)
        self.keep = keep
        self.every = max(1, keep // 8)
        self.engine = None              # the engine whose run it trims, once it started
        self.num_forgotten = 0          # requests dropped from the trace so far
        self._ends = 0

    def note_end(self) -> int:
        """A request ended (engine thread). Returns how many preemption records were dropped."""
        self._ends += 1
        if self._ends < self.every or self.engine is None:
            return 0
        self._ends = 0
        return self.trim()

    def trim(self) -> int:
        """Drop the oldest ended requests past ``keep``; returns the preemption records dropped."""
        num_requests, num_preemptions = forget_ended(self.engine, self.keep)
        self.num_forgotten += num_requests
        return num_preemptions


def run_online_bounded(engine, inbox, listener, window: TraceWindow):
    """``engine.run_online(inbox, listener)`` with ``window`` trimming the engine's run as it goes.
    Returns the trace of the requests still in the window."""
    window.engine = engine
    trace = engine.run_online(inbox, listener)
    trace.meta["num_forgotten"] = window.num_forgotten
    return trace
