"""What the load client records per request, and the ``Trace`` built from it.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from batchlab.requests import FinishReason, RequestStatus
from batchlab.trace import RequestRecord, Trace

FINISHED_REASONS = ("stop", "length")


@dataclass
class ClientRecord:
    """One request, as the client saw it (times: seconds since the load began)."""

    request_id: str
    prompt_len: int
    max_tokens: int
    scheduled_time: float                  # when the load plan wanted it sent
    send_time: float | None = None         # when it was really sent
    status_code: int | None = None
    chunk_times: list[float] = field(default_factory=list)     # each chunk that carried tokens
    chunk_tokens: list[int] = field(default_factory=list)      # tokens in that chunk
    end_time: float | None = None          # the response's last byte ([DONE] or the whole body)
    finish_reason: str | None = None       # as the server said ("stop", "length", "abort", ...)
    error: str | None = None               # error body or exception text
    text: str = ""
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    # "usage" (the server's running count) or "chunks" (1 each)
    tokens_counted_by: str = "chunks"
    server: dict | None = None             # the server's own timings (batchlab's extension field)
    client_t0_unix: float = 0.0            # unix time of this load's t = 0 (to place server times)

    @property
    def num_tokens(self) -> int:
        return int(sum(self.chunk_tokens))

    @property
    def ok(self) -> bool:
        return (self.status_code == 200 and self.error is None
                and self.finish_reason in FINISHED_REASONS)

    @property
    def outcome(self) -> str:
        """How it ended, for counting: "ok", "HTTP <code>", "HTTP 200, <why>" (an error or another
        finish reason inside a stream), or the client-side failure ("ConnectError", "cancelled",
        "not sent", ...)."""
        if self.ok:
            return "ok"
        if self.status_code is not None and self.status_code != 200:
            return f"HTTP {self.status_code}"
        if self.status_code == 200:
            return ("HTTP 200, error in stream" if self.error
                    else f"HTTP 200, finish_reason {self.finish_reason}")
        return (self.error or "not sent").split(":")[0]

    @property
    def ttft(self) -> float | None:
        if self.send_time is None or not self.chunk_times:
            return None
        return self.chunk_times[0] - self.send_time

    def token_times(self) -> list[float]:
        """One time per token: each chunk's arrival, repeated for every token it carried."""
        return [t for t, k in zip(self.chunk_times, self.chunk_tokens) for _ in range(k)]

    def status(self) -> tuple[RequestStatus, FinishReason, str | None]:
        """How the request ended, as an engine would record it: status, reason, and why in words."""
        if self.ok:
            return RequestStatus.FINISHED, FinishReason(self.finish_reason), None
        if self.status_code is not None and 400 <= self.status_code < 500:
            return (RequestStatus.REJECTED, FinishReason.REJECTED,
                    f"HTTP {self.status_code}: {self.error}")
        why = self.error or f"finish_reason {self.finish_reason!r}"
        return RequestStatus.ABORTED, FinishReason.ABORT, f"HTTP {self.status_code}: {why}"

    def server_time(self, engine_time: float | None) -> float | None:
        """An engine-clock time from the server's timings, on this load's clock."""
        if engine_time is None or not self.server or "engine_clock_unix_offset" not in self.server:
            return None
        return engine_time + self.server["engine_clock_unix_offset"] - self.client_t0_unix


def client_trace(records: list[ClientRecord], meta: dict | None = None) -> Trace:
    """The client's view as a ``Trace`` (see the module docstring). Requests sorted by send time."""
    out = []
    for r in sorted(records,
                    key=lambda r: (r.send_time if r.send_time is not None else r.scheduled_time)):
        status, reason, detail = r.status()
        arrival = r.send_time if r.send_time is not None else r.scheduled_time
        times = r.token_times() if status is not RequestStatus.REJECTED else []
        first_scheduled = r.server_time((r.server or {}).get("first_scheduled_time"))
        prompt_len = r.usage_prompt_tokens or r.prompt_len
        out.append(RequestRecord(r.request_id, arrival, prompt_len, r.max_tokens, status, reason,
                                 first_scheduled, times, r.end_time, True,
                                 list((r.server or {}).get("token_ids") or []), detail))
    return Trace(requests=out, steps=[], meta={"clock": "client", **(meta or {})})


def server_trace(records: list[ClientRecord], meta: dict | None = None) -> Trace:
    """The engine's own times for the same requests (from the server's extension field), on the
    client's clock. Requests without server timings (refused, or another server) are left out."""
    out = []
    for r in records:
        s = r.server
        if not s or "engine_clock_unix_offset" not in s or not r.ok:
            continue
        times = [r.server_time(t) for t in s.get("token_times") or []]
        if s.get("policy") in ("static", "dynamic") and s.get("first_token_time") is not None \
                and times and s["first_token_time"] >= s.get("finish_time", 0):
            streamed = False                # handed back whole at release
        else:
            streamed = True
        out.append(RequestRecord(r.request_id, r.server_time(s["arrival_time"]),
                                 r.usage_prompt_tokens or r.prompt_len,
                                 r.max_tokens, RequestStatus.FINISHED,
                                 FinishReason(r.finish_reason),
                                 r.server_time(s.get("first_scheduled_time")), times,
                                 r.server_time(s.get("release_time")), streamed,
                                 list(s.get("token_ids") or [])))
    out.sort(key=lambda q: q.arrival_time)
    return Trace(requests=out, steps=[],
                 meta={"clock": "server (on the client's clock)", **(meta or {})})


def chunk_gaps(records: list[ClientRecord]) -> np.ndarray:
    """Gaps between successive chunks (not tokens), pooled over finished requests: what a client
    that counts one token per chunk would call ITL."""
    gaps = [np.diff(np.asarray(r.chunk_times, dtype=float)) for r in records
            if r.ok and len(r.chunk_times) > 1]
    return np.concatenate(gaps) if gaps else np.empty(0)
