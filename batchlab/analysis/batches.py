"""Request-level batches, read back from a trace: who ran together, when, and who waited for whom.

The rules and their reasons: ``docs/workloads-and-metrics.md``.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from batchlab.checks import check_instance
from batchlab.trace import Trace

BATCH_COLUMNS: list[str] = [
    "batch_id", "size", "request_ids", "first_arrival", "last_arrival", "start", "end",
    "previous_end", "formed_while", "max_wait", "num_steps", "shortest_output", "longest_output",
]


def batches_df(trace: Trace) -> pd.DataFrame:
    """One row per request-level batch, in the order the batches ran.

    Columns: ``batch_id``; ``size`` (members) and ``request_ids`` (a tuple, admission order);
    ``first_arrival`` / ``last_arrival`` (of its members); ``start`` / ``end`` (its first step's
    start, its last step's end); ``previous_end`` (when the batch before it ended; NaN for the
    first); ``formed_while`` ("idle" if the previous batch had ended by ``first_arrival``, else
    "busy"); ``max_wait`` (``start - first_arrival``: the longest any member waited for the batch
    to start); ``num_steps``; ``shortest_output`` / ``longest_output`` (output tokens of its
    members). Times in seconds on the trace's clock.
    """
    check_instance("trace", trace, Trace, "a batchlab Trace")
    # One pass over the steps: first step (members), start, end and step count per batch.
    first_step, start, end, num_steps, order = {}, {}, {}, {}, []
    for step in trace.steps:
        b = step.batch_id
        if b is None:
            continue
        if b not in first_step:
            first_step[b] = step
            start[b] = step.start
            num_steps[b] = 0
            order.append(b)
        end[b] = step.end
        num_steps[b] += 1
    records = {r.request_id: r for r in trace.requests}
    rows, previous_end = [], float("nan")
    for b in order:
        # Every member computes its prompt in the batch's first step, so that step lists them all.
        members = [records[c.request_id] for c in first_step[b].chunks]
        arrivals = [r.arrival_time for r in members]
        outputs = [r.num_output_tokens for r in members]
        first_arrival = min(arrivals)
        idle = previous_end != previous_end or previous_end <= first_arrival  # NaN: first batch
        rows.append({
            "batch_id": b, "size": len(members),
            "request_ids": tuple(r.request_id for r in members),
            "first_arrival": first_arrival, "last_arrival": max(arrivals),
            "start": start[b], "end": end[b], "previous_end": previous_end,
            "formed_while": "idle" if idle else "busy", "max_wait": start[b] - first_arrival,
            "num_steps": num_steps[b], "shortest_output": min(outputs),
            "longest_output": max(outputs),
        })
        previous_end = end[b]
    return pd.DataFrame(rows, columns=BATCH_COLUMNS)


def delivered_at_batch_end(trace: Trace) -> Trace:
    """The same run as a non-streaming server would have delivered it: every member's whole
    response handed back when its batch ends.

    Streaming does not change what a request-level batcher schedules (a finished member's slot is
    held until its batch ends either way); it changes only when the client sees the tokens. So a
    streamed trace of ``StaticBatcher(..., stream=True)`` or ``DynamicBatcher(..., stream=True)``
    gives the non-streaming one exactly, without running the model again.
    """
    ends = {rid: row.end for row in batches_df(trace).itertuples() for rid in row.request_ids}
    if not ends:
        raise ValueError("this trace has no request-level batches (continuous batching streams "
                         "by design); pass a StaticBatcher or DynamicBatcher trace")
    requests = [replace(r, release_time=ends[r.request_id], streamed=False) if r.request_id in ends
                else r for r in trace.requests]
    return Trace(requests, trace.steps, {**trace.meta, "delivery": "at batch end"},
                 trace.preemptions)
