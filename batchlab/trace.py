"""What an engine run leaves behind: every request's life and every step, as tables.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import pandas as pd

from batchlab.plan import ScheduledChunk, chunk_counts
from batchlab.requests import FinishReason, Request, RequestStatus


@dataclass(slots=True)
class StepRecord:
    """One engine step: when it ran, what it computed, and for whom.

    Its sizes are counted from ``chunks`` when first read, unless given as ``counts``
    (``num_tokens, num_prefill_tokens, num_decode_seqs``): the simulator's fast path knows them,
    since a decode run's step is ``num_seqs`` decodes.
    """

    index: int
    start: float
    duration: float
    chunks: Sequence[ScheduledChunk]     # a list, or DecodeChunks for a simulator decode run
    held_slots: int = 0
    batch_id: int | None = None
    counts: tuple[int, int, int] | None = None

    def _counts(self) -> tuple[int, int, int]:
        if self.counts is None:
            self.counts = chunk_counts(self.chunks)
        return self.counts

    @property
    def num_seqs(self) -> int:
        return len(self.chunks)

    @property
    def num_tokens(self) -> int:
        return self._counts()[0]

    @property
    def num_prefill_tokens(self) -> int:
        return self._counts()[1]

    @property
    def num_decode_seqs(self) -> int:
        return self._counts()[2]

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass
class RequestRecord:
    """A finished (or rejected) request, as the client and the server saw it."""

    request_id: str
    arrival_time: float
    prompt_len: int
    max_new_tokens: int
    status: RequestStatus
    finish_reason: FinishReason | None
    first_scheduled_time: float | None
    token_times: list[float]          # when each output token was computed
    release_time: float | None        # when the full response reached the client
    streamed: bool                    # True: tokens were visible as computed
    output_ids: list[int] = field(default_factory=list)
    finish_detail: str | None = None  # why it was aborted or rejected, in words
    # (drafted, accepted) per check
    spec_checks: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_times)

    @property
    def visible_token_times(self) -> list[float]:
        """When the client saw each token: as computed when streamed, else all at release."""
        if self.streamed or self.release_time is None:
            return list(self.token_times)
        return [self.release_time] * len(self.token_times)

    @property
    def finish_time(self) -> float | None:
        return self.token_times[-1] if self.token_times else None


def request_records(requests: Sequence[Request], release_times: Mapping[str, float | None],
                    streamed: bool) -> list[RequestRecord]:
    """Each ended request's record; its token lists move into the trace (the run's own copies)."""
    return [RequestRecord(r.request_id, r.arrival_time, r.prompt_len, r.max_new_tokens, r.status,
                          r.finish_reason,
                          r.first_scheduled_time, r.token_times, release_times[r.request_id],
                          streamed,
                          r.output_ids, r.finish_detail,
                          [] if r.spec is None else r.spec.checks) for r in requests]


@dataclass(frozen=True)
class PreemptionRecord:
    """A running request sent back to the waiting queue because the KV cache ran out of blocks.

    ``time``: the start of the step being planned. ``num_computed_tokens``: the tokens whose keys
    and values were dropped and must be computed again when it resumes (prompt and generated
    tokens alike; prefix-cache hits may spare some). ``num_output_tokens``: tokens it had already
    produced; the client keeps them, and they are recomputed, not sampled again.
    """

    request_id: str
    time: float
    num_computed_tokens: int
    num_output_tokens: int


@dataclass
class Trace:
    """Everything one engine run recorded. ``meta`` holds free-form labels (policy, clock, ...)."""

    requests: list[RequestRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    preemptions: list[PreemptionRecord] = field(default_factory=list)

    # --- tables ------------------------------------------------------------------------------
    def requests_df(self) -> pd.DataFrame:
        """One row per request, with its key times (NaN where it never got there)."""
        rows = []
        for r in self.requests:
            vis = r.visible_token_times
            rows.append({
                "request_id": r.request_id, "arrival_time": r.arrival_time,
                "prompt_len": r.prompt_len, "max_new_tokens": r.max_new_tokens,
                "num_output_tokens": r.num_output_tokens, "status": r.status.value,
                "finish_reason": r.finish_reason, "finish_detail": r.finish_detail,
                "streamed": r.streamed,
                "first_scheduled_time": r.first_scheduled_time,
                "first_token_time": vis[0] if vis else None,
                "finish_time": r.finish_time, "release_time": r.release_time,
            })
        return pd.DataFrame(rows, columns=[
            "request_id", "arrival_time", "prompt_len", "max_new_tokens", "num_output_tokens",
            "status", "finish_reason", "finish_detail", "streamed", "first_scheduled_time",
            "first_token_time",
            "finish_time", "release_time"]).astype({"first_scheduled_time": float,
                                                     "first_token_time": float,
                                                     "finish_time": float, "release_time": float})

    def tokens_df(self) -> pd.DataFrame:
        """One row per output token: when it was computed and when the client saw it."""
        rows = [(r.request_id, i, t, v)
                for r in self.requests
                for i, (t, v) in enumerate(zip(r.token_times, r.visible_token_times))]
        return pd.DataFrame(rows,
                            columns=["request_id", "token_index", "computed_time", "visible_time"])

    def steps_df(self) -> pd.DataFrame:
        """One row per step: start, duration, batch size, tokens, prefill/decode mix."""
        rows = [{"step": s.index, "start": s.start, "end": s.end, "duration": s.duration,
                 "num_seqs": s.num_seqs, "num_tokens": s.num_tokens,
                 "num_prefill_tokens": s.num_prefill_tokens, "num_decode_seqs": s.num_decode_seqs,
                 "held_slots": s.held_slots, "batch_id": s.batch_id}
                for s in self.steps]
        return pd.DataFrame(rows,
                            columns=["step", "start", "end", "duration", "num_seqs", "num_tokens",
                                           "num_prefill_tokens", "num_decode_seqs", "held_slots",
                                           "batch_id"])

    def chunks_df(self) -> pd.DataFrame:
        """One row per (step, request) pair: what each request computed in each step."""
        rows = [{"step": s.index, "start": s.start, "end": s.end, "request_id": c.request_id,
                 "token_start": c.start, "num_tokens": c.num_tokens,
                 "kind": "decode" if c.is_decode else "prefill", "batch_id": s.batch_id}
                for s in self.steps for c in s.chunks]
        return pd.DataFrame(rows, columns=["step", "start", "end", "request_id", "token_start",
                                           "num_tokens", "kind", "batch_id"])

    def preemptions_df(self) -> pd.DataFrame:
        """One row per preemption: who, when, and how many computed tokens it lost."""
        return pd.DataFrame([asdict(p) for p in self.preemptions],
                            columns=["request_id", "time", "num_computed_tokens",
                                     "num_output_tokens"])

    @property
    def duration(self) -> float:
        """From the first arrival to the last release (or last step end)."""
        if not self.requests:
            return 0.0
        first = min(r.arrival_time for r in self.requests)
        ends = [r.release_time for r in self.requests if r.release_time is not None]
        ends += [s.end for s in self.steps]
        return (max(ends) - first) if ends else 0.0

    @property
    def busy_time(self) -> float:
        """Seconds the device spent computing steps."""
        return sum(s.duration for s in self.steps)
