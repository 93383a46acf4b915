"""Worked solutions for notebook 10 (measuring a real server from the outside): functions of
the load client's records."""

import numpy as np


def client_overhead(records) -> float:
    """10.1: per request, what the client waited for its first token minus what the engine
    itself measured (arrival at the engine to first token); the median of those differences."""
    return float(np.median([(r.chunk_times[0] - r.send_time) - r.server["ttft_s"] for r in records]))


def token_gaps(record) -> list:
    """10.2: every token is visible when its chunk arrives, so a chunk of k tokens repeats its
    time k times; the gaps between successive tokens include k - 1 zeros per chunk."""
    times = [t for t, k in zip(record.chunk_times, record.chunk_tokens) for _ in range(k)]
    return list(np.diff(times))


def max_in_flight(records) -> int:
    """10.3: sweep the sends (+1) and ends (-1) in time order; an end at the same instant as a
    send is counted first (that slot was free)."""
    events = sorted([(r.send_time, 1) for r in records] + [(r.end_time, -1) for r in records])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def _wrong_overhead(records) -> float:
    """The difference of two medians: each median can come from a different request."""
    client = np.median([r.chunk_times[0] - r.send_time for r in records])
    server = np.median([r.server["ttft_s"] for r in records])
    return float(client - server)


def _wrong_token_gaps(record) -> list:
    """Gaps between chunks: what a client that counts one token per chunk reports."""
    return list(np.diff(record.chunk_times))


def _wrong_max_in_flight(records) -> int:
    """The most requests sent within one second: a rate, not a count of overlapping requests."""
    sends = np.sort([r.send_time for r in records])
    return int(max(np.searchsorted(sends, s + 1.0) - i for i, s in enumerate(sends)))


SOLUTIONS = {
    "10.1": lambda: client_overhead,
    "10.2": lambda: token_gaps,
    "10.3": lambda: max_in_flight,
}
WRONG = {"10.1": _wrong_overhead, "10.2": _wrong_token_gaps, "10.3": _wrong_max_in_flight}
