"""Scripted workloads: requests at exactly the times and with exactly the lengths a scene needs.

The rules and their reasons: ``docs/workloads-and-metrics.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from batchlab.checks import check_instance, check_int, check_list, check_number, fail, is_int
from batchlab.requests import Request
from batchlab.workloads import CorpusPrompts, prompt_seed, request_ids


def _per_request(value: int | Sequence[int], n: int, what: str) -> list[int]:
    """One int >= 1 per request: a single int is repeated, a sequence must have ``n`` items."""
    if is_int(value):
        values = [value] * n
    elif isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, str):
        values = list(value)
    else:
        fail(what, value, "an int >= 1 or one such int per request", "a number of tokens")
    if len(values) != n:
        fail(what, value, f"one int for all requests or a list of {n}, one per request",
             f"it has {len(values)} values but there are {n} arrival times")
    for i, v in enumerate(values):
        check_int(f"{what}[{i}]", v, hint="a number of tokens")
    return [int(v) for v in values]


def scripted_workload(arrival_times: Sequence[float], max_new_tokens: int | Sequence[int],
                      prompt_len: int | Sequence[int] = 16, *, tokenizer: Any = None,
                      id_prefix: str = "r") -> list[Request]:
    """Requests ``r000, r001, ...`` arriving at ``arrival_times`` (seconds, non-decreasing, >= 0).

    ``max_new_tokens`` and ``prompt_len``: one int for every request, or one per request.
    ``tokenizer``: real prompts cut from the corpus (as ``make_workload`` does); ``None`` makes
    simulated requests. Requests are greedy and make exactly ``max_new_tokens`` tokens each.
    """
    times = check_list("arrival_times", arrival_times, "a non-empty list of arrival times",
                       hint="seconds, in order of arrival")
    for i, t in enumerate(times):
        check_number(f"arrival_times[{i}]", t, hint="seconds")
        if i and t < times[i - 1]:
            fail(f"arrival_times[{i}]", t, f">= arrival_times[{i - 1}]={times[i - 1]!r}",
                 "list requests in order of arrival; this one is earlier than the one before")
    times = [float(t) for t in times]
    n = len(times)
    outputs = _per_request(max_new_tokens, n, "max_new_tokens")
    prompts = _per_request(prompt_len, n, "prompt_len")
    check_instance("id_prefix", id_prefix, str, "a string")
    source = CorpusPrompts(tokenizer) if tokenizer is not None else None

    requests = []
    for request_id, t, out, length in zip(request_ids(n, id_prefix), times, outputs, prompts):
        # The prompt window depends on the id only, exactly as in make_workload.
        ids = None if source is None else source(length,
                                                 np.random.default_rng(prompt_seed(request_id)))
        requests.append(Request(request_id, ids, out, t, prompt_len=length))
    return requests
