"""Where did the waiting go? A trace compared with what an empty server would have given.

The rules and their reasons: ``docs/workloads-and-metrics.md``.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from batchlab.analysis.metrics import per_request_metrics
from batchlab.steptime.cost_model import CostModel
from batchlab.checks import check_instance, check_int
from batchlab.plan import chunk_attention_pairs
from batchlab.trace import Trace


def _check_cost(cost: CostModel) -> None:
    check_instance("cost", cost, CostModel, "a batchlab CostModel", hint="CostModel.load(path)")


def lone_ttft(cost: CostModel, prompt_len: int) -> float:
    """Seconds to the first token of a request alone on an empty server: its whole prompt in one
    step (``prompt_len`` tokens, ``prompt_len * (prompt_len + 1) / 2`` attention pairs)."""
    _check_cost(cost)
    check_int("prompt_len", prompt_len)
    p = int(prompt_len)
    return cost.predict_features(1, p, chunk_attention_pairs(0, p))


def lone_decode_time(cost: CostModel, prompt_len: int, num_output_tokens: int) -> float:
    """Seconds from the first to the last token of a request alone on an empty server.

    Output token ``i`` (``i = 2 .. n``) needs a decode step of one sequence at position
    ``prompt_len + i - 2``, which reads ``prompt_len + i - 1`` keys; so the ``n - 1`` steps cost
    ``(n - 1) * (fixed + per_seq + per_token)`` plus ``per_attention_pair`` times the keys read.
    """
    _check_cost(cost)
    check_int("num_output_tokens", num_output_tokens)
    check_int("prompt_len", prompt_len)
    steps = int(num_output_tokens) - 1
    # Keys read: prompt_len + 1, prompt_len + 2, ..., prompt_len + steps: the same query-key
    # pairs as computing tokens [prompt_len, prompt_len + steps) in one chunk.
    keys = chunk_attention_pairs(int(prompt_len), steps)
    return (steps * (cost.fixed_s + cost.per_seq_s + cost.per_token_s)
            + cost.per_attention_pair_s * keys)


def excess_latency(trace: Trace, cost: CostModel) -> pd.DataFrame:
    """One row per finished request: its latencies, the lone-request yardsticks and the excess.

    Columns: ``request_id``, ``arrival_time``, ``prompt_len``, ``num_output_tokens``,
    ``queue_time``, ``ttft``, ``lone_ttft``, ``ttft_excess`` (= ttft - lone_ttft), ``stream``
    (= e2e - ttft), ``lone_stream``, ``stream_excess`` (= stream - lone_stream), ``e2e``. All in
    seconds. An excess can be slightly negative when a step ran faster than the cost model says
    (the simulator's noise, or a real measurement).
    """
    _check_cost(cost)
    pr = per_request_metrics(trace)
    lone_first = np.array([lone_ttft(cost, int(p)) for p in pr["prompt_len"]])
    lone_stream = np.array([lone_decode_time(cost, int(p), int(n))
                            for p, n in zip(pr["prompt_len"], pr["num_output_tokens"])])
    out = pd.DataFrame({
        "request_id": pr["request_id"], "arrival_time": pr["arrival_time"],
        "prompt_len": pr["prompt_len"], "num_output_tokens": pr["num_output_tokens"],
        "queue_time": pr["queue_time"], "ttft": pr["ttft"], "lone_ttft": lone_first,
        "ttft_excess": pr["ttft"] - lone_first,
        "stream": pr["e2e"] - pr["ttft"], "lone_stream": lone_stream,
        "stream_excess": (pr["e2e"] - pr["ttft"]) - lone_stream, "e2e": pr["e2e"],
    })
    return out


def excess_share_before_first_token(trace: Trace, cost: CostModel) -> float:
    """Of all the excess waiting in the run (summed over requests, negatives counted as 0),
    the share that came before the first token. Above 0.5: users mostly feel a late first
    token; below: mostly a slow stream."""
    ex = excess_latency(trace, cost)
    before = ex["ttft_excess"].clip(lower=0).sum()
    after = ex["stream_excess"].clip(lower=0).sum()
    if before + after == 0:
        return 0.0
    return float(before / (before + after))


def token_gaps(trace: Trace, request_ids: Iterable[str] | None = None) -> pd.DataFrame:
    """Every gap between successive visible tokens, with the step that produced the later token.

    Columns: ``request_id``, ``token_index`` (of the later token), ``time`` (when the client saw
    it, s), ``gap`` (s since the same request's previous token), and from that token's step:
    ``step``, ``step_duration``, ``step_num_seqs``, ``step_prefill_tokens``. ``request_ids`` keeps
    only those requests (default: all). Only streamed requests have gaps that steps explain; for
    a non-streamed one the gaps are 0. A token is produced by the step that ends when it is
    computed (matched within 2 µs, so traces saved to a file and loaded back match too).
    """
    check_instance("trace", trace, Trace, "a batchlab Trace")
    tokens = trace.tokens_df()
    if request_ids is not None:
        keep = set(request_ids)
        unknown = keep - {r.request_id for r in trace.requests}
        if unknown:
            raise ValueError(f"request id(s) {sorted(unknown)} are not in the trace")
        tokens = tokens[tokens["request_id"].isin(keep)]
    tokens = tokens.sort_values(["request_id", "token_index"], kind="stable")
    tokens["gap"] = tokens.groupby("request_id")["visible_time"].diff()
    gaps = tokens.dropna(subset=["gap"]).sort_values("computed_time", kind="stable")
    steps = trace.steps_df()[["step", "end", "duration", "num_seqs", "num_prefill_tokens"]]
    steps = steps.rename(columns={"duration": "step_duration", "num_seqs": "step_num_seqs",
                                  "num_prefill_tokens": "step_prefill_tokens"}).sort_values("end")
    merged = pd.merge_asof(gaps, steps, left_on="computed_time", right_on="end",
                           direction="nearest", tolerance=2e-6)
    merged = merged.sort_values(["request_id", "token_index"], kind="stable").reset_index(drop=True)
    merged = merged.rename(columns={"visible_time": "time"})
    return merged[["request_id", "token_index", "time", "gap", "step", "step_duration",
                   "step_num_seqs", "step_prefill_tokens"]]


def num_waiting_at(trace: Trace, times: np.ndarray) -> np.ndarray:
    """How many requests had arrived but not yet been scheduled at each of ``times`` (seconds).

    A request waits from its arrival until its first step starts (rejected requests never
    wait: the engine turns them away on arrival). Shape: same as ``times``.
    """
    times = np.asarray(times, dtype=float)
    arrivals = np.sort([r.arrival_time for r in trace.requests
                        if r.first_scheduled_time is not None])
    starts = np.sort([r.first_scheduled_time for r in trace.requests
                      if r.first_scheduled_time is not None])
    # Arrived by t (arrival <= t) minus started by t (first step started at or before t).
    return (np.searchsorted(arrivals, times, side="right")
            - np.searchsorted(starts, times, side="right"))


def steps_with_waiting(trace: Trace) -> pd.DataFrame:
    """``trace.steps_df()`` plus ``num_waiting``: requests left waiting while the step ran
    (arrived by its start, first scheduled later). A step that runs while others wait shows
    how much the policy let in when it had the choice."""
    steps = trace.steps_df()
    steps["num_waiting"] = num_waiting_at(trace, steps["start"].to_numpy(dtype=float))
    return steps


def _merge_intervals(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of half-open intervals, as sorted disjoint intervals."""
    merged: list[tuple[float, float]] = []
    for lo, hi in sorted(i for i in intervals if i[1] > i[0]):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def idle_while_waiting(trace: Trace) -> float:
    """Seconds during which at least one request was waiting and the device computed nothing.

    On a continuous batcher this is about 0: a waiting request is admitted at the next step if
    there is room at all. A request-level batcher that waits for its batch to fill, or for its
    timer, leaves the device idle while people wait.
    """
    waiting = _merge_intervals([(r.arrival_time, r.first_scheduled_time) for r in trace.requests
                                if r.first_scheduled_time is not None])
    busy = _merge_intervals([(s.start, s.end) for s in trace.steps])
    total = 0.0
    for lo, hi in waiting:
        # The waiting interval's length minus the busy time inside it.
        covered = sum(max(0.0, min(hi, b_hi) - max(lo, b_lo)) for b_lo, b_hi in busy
                      if b_lo < hi and b_hi > lo)
        total += (hi - lo) - covered
    return float(total)
