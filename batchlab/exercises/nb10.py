"""Checkers for notebook 10 (measuring a real server from the outside).

Each exercise asks for a *function of the load client's records* (``ClientRecord``: send and end
times, each chunk's arrival and token count, the server's own timings). The checker builds its
own records from a fixed random stream, shaped like real ones (chunks of several tokens, slow
first tokens, requests that overlap), calls the reader's function and compares with the answer
computed here.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from batchlab.exercises import Verdict, call_reader, compare, exercise, not_a_function
from batchlab.loadgen.records import ClientRecord


@lru_cache(maxsize=1)
def checker_records() -> tuple[ClientRecord, ...]:
    """40 finished streamed requests: Poisson sends, server-side TTFTs with a long tail, client
    overheads of a few ms, 2-12 chunks of 1-3 tokens each."""
    rng = np.random.default_rng(1010)
    records = []
    t = 0.0
    for i in range(40):
        t += rng.exponential(0.25)
        engine_ttft = 0.05 + rng.exponential(0.2) ** 2          # skewed: mean and median differ
        overhead = 0.002 + rng.exponential(0.004)
        first = t + engine_ttft + overhead
        n_chunks = int(rng.integers(2, 13))
        times = first + np.concatenate([[0.0], np.cumsum(rng.uniform(0.02, 0.12, n_chunks - 1))])
        tokens = rng.integers(1, 4, n_chunks).tolist()
        records.append(ClientRecord(f"c{i:02d}", 32, int(sum(tokens)), t, send_time=t,
                                    status_code=200,
                                    chunk_times=[float(x) for x in times], chunk_tokens=tokens,
                                    end_time=float(times[-1]) + 0.001, finish_reason="length",
                                    server={"ttft_s": float(engine_ttft)}))
    return tuple(records)


# --- 10.1 ----------------------------------------------------------------------------------------
def expected_overhead(records) -> float:
    """The median over requests of (client TTFT - the server's own TTFT)."""
    return float(np.median([(r.chunk_times[0] - r.send_time) - r.server["ttft_s"]
                            for r in records]))


@exercise("10.1")
def check_overhead(answer) -> Verdict:
    """``answer(records)`` -> float: the median per-request client-minus-server TTFT (seconds)."""
    if (v := not_a_function(answer, "check('10.1', client_overhead)")) is not None:
        return v
    records = list(checker_records())
    got, error = call_reader(answer, records)
    if error:
        return Verdict("wrong", error)
    v = compare(got, expected_overhead(records), rtol=1e-9, atol=1e-12, what="median overhead")
    if not v.ok:
        return Verdict("wrong",
                       v.message + " (subtract request by request, then take the median: the "
                                            "difference of two medians mixes different requests)")
    return Verdict("correct", "the median client-side overhead matches")


# --- 10.2 ----------------------------------------------------------------------------------------
def expected_token_gaps(record: ClientRecord) -> list[float]:
    times = [t for t, k in zip(record.chunk_times, record.chunk_tokens) for _ in range(k)]
    return list(np.diff(times))


@exercise("10.2")
def check_token_gaps(answer) -> Verdict:
    """``answer(record)`` -> list of the gaps between successive *tokens* (seconds)."""
    if (v := not_a_function(answer, "check('10.2', token_gaps)")) is not None:
        return v
    for r in checker_records():
        got, error = call_reader(answer, r)
        if error:
            return Verdict("wrong", f"on request {r.request_id}: {error}")
        expected = expected_token_gaps(r)
        try:
            got = [float(x) for x in got]
        except (TypeError, ValueError):
            return Verdict("wrong", "return a list of numbers")
        if len(got) != len(expected):
            return Verdict("wrong", f"request {r.request_id} has {sum(r.chunk_tokens)} tokens, so "
                                    f"{len(expected)} gaps; you returned {len(got)} (a chunk of k "
                                    "tokens makes k - 1 gaps of 0 inside it)")
        v = compare(got, expected, rtol=1e-9, atol=1e-12, what=f"gaps of {r.request_id}")
        if not v.ok:
            return Verdict("wrong", v.message)
    return Verdict("correct", "token gaps match on all 40 requests, zeros inside chunks included")


# --- 10.3 ----------------------------------------------------------------------------------------
def expected_max_in_flight(records) -> int:
    events = sorted([(r.send_time, 1) for r in records] + [(r.end_time, -1) for r in records],
                    key=lambda e: (e[0], e[1]))          # an end before a send at the same instant
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


@exercise("10.3")
def check_max_in_flight(answer) -> Verdict:
    """``answer(records)`` -> int: the most requests in flight (sent, not ended) at any moment."""
    if (v := not_a_function(answer, "check('10.3', max_in_flight)")) is not None:
        return v
    records = list(checker_records())
    for subset, what in ((records, "all 40 requests"), (records[:10], "the first 10")):
        got, error = call_reader(answer, subset)
        if error:
            return Verdict("wrong", error)
        expected = expected_max_in_flight(subset)
        if got != expected:
            return Verdict("wrong", f"for {what} the peak is {expected} requests in flight; "
                                    f"you returned {got!r}")
    return Verdict("correct", "the peak number of requests in flight matches")
