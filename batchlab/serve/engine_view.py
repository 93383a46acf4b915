"""Everything the server reads from the engine's insides, in one place.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from batchlab.checks import check_int
from batchlab.online import forget_ended
from batchlab.requests import Request, RequestStatus

API_FINISH_REASONS = ("length", "stop")


# --- how a request ended -------------------------------------------------------------------------
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
    # prompt tokens found in the prefix cache, over the server's life
    prefix_cache_hit_tokens: int


def read_engine_stats(scheduler, kv) -> EngineStats:
    """Running and waiting requests (request-level batchers: the batch's members run), KV usage,
    prefix-cache hits (paged KV with prefix caching; 0 otherwise)."""
    return EngineStats(len(scheduler.running_requests()), len(scheduler.waiting), kv.used_tokens,
                       kv.capacity_tokens, kv.num_hit_tokens)


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

    def note_end(self) -> None:
        """A request ended (engine thread)."""
        self._ends += 1
        if self._ends >= self.every and self.engine is not None:
            self._ends = 0
            self.trim()

    def trim(self) -> None:
        """Drop the oldest ended requests past ``keep``."""
        num_requests, _ = forget_ended(self.engine, self.keep)
        self.num_forgotten += num_requests


def run_online_bounded(engine, inbox, listener, window: TraceWindow):
    """``engine.run_online(inbox, listener)`` with ``window`` trimming the engine's run as it goes.
    Returns the trace of the requests still in the window."""
    window.engine = engine
    trace = engine.run_online(inbox, listener)
    trace.meta["num_forgotten"] = window.num_forgotten
    return trace
