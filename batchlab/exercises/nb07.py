"""Checkers for notebook 07 (measuring TTFT, ITL and tails).

Each exercise asks for a *function* of a trace. The checker builds its own traces on the
simulator (a fixed, hand-written cost model, so they are the same on every machine), calls the
reader's function on each, and compares with the answer computed here from the trace's raw
times. The traces include a non-streaming one, where what the client saw (``visible_time``)
differs from when tokens were computed.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import pandas as pd

from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.exercises import Verdict, call_reader, compare, exercise, not_a_function
from batchlab.schedulers import ContinuousBatcher, DynamicBatcher
from batchlab.trace import Trace
from batchlab.workloads import make_workload

# A small device: 20 ms per step, 1 ms per sequence, 0.2 ms per token.
CHECK_COST = CostModel(fixed_s=0.02, per_seq_s=0.001, per_token_s=0.0002,
                       per_attention_pair_s=1e-8, source="hand-written for the 06 checkers")


@lru_cache(maxsize=1)
def checker_traces() -> dict[str, Trace]:
    """Three small runs: streaming continuous batching under bursty load, the same requests on a
    non-streaming dynamic batcher, and a run with 1-token answers mixed in."""
    bursty = make_workload(60, "chat", scale="full", arrival="gamma", rate=6.0, burstiness=0.3,
                           seed=61)
    one_token = make_workload(30, prompt_len=64, output_len=1, arrival="poisson", rate=4.0, seed=62,
                              id_prefix="s")
    mixed = sorted(make_workload(30, "chat", scale="full", arrival="poisson", rate=4.0, seed=63)
                   + one_token, key=lambda r: r.arrival_time)

    def serve(scheduler, requests):
        return Engine(scheduler, SimBackend(CHECK_COST, kv_capacity_tokens=1 << 16)).run(requests)

    return {
        "continuous": serve(ContinuousBatcher(max_num_seqs=8, max_num_batched_tokens=512), bursty),
        "dynamic_non_streaming": serve(DynamicBatcher(max_batch_size=8, timeout=0.5), bursty),
        "mixed_lengths": serve(ContinuousBatcher(max_num_seqs=16, max_num_batched_tokens=512),
                               mixed),
    }


def _visible_times(trace: Trace) -> dict[str, tuple[float, np.ndarray]]:
    """request id -> (arrival, visible token times) for finished requests, from the raw records."""
    return {r.request_id: (r.arrival_time, np.asarray(r.visible_token_times, dtype=float))
            for r in trace.requests if r.status.value == "finished"}


# --- 07.1 ----------------------------------------------------------------------------------------
def expected_latencies(trace: Trace) -> pd.DataFrame:
    """TTFT, TPOT (NaN for one token) and E2E per finished request, indexed by request id."""
    rows = {}
    for rid, (arrival, t) in _visible_times(trace).items():
        ttft, e2e = t[0] - arrival, t[-1] - arrival
        rows[rid] = {"ttft": ttft, "tpot": (e2e - ttft) / (len(t) - 1) if len(t) > 1 else np.nan,
                     "e2e": e2e}
    return pd.DataFrame.from_dict(rows, orient="index").sort_index()


@exercise("07.1")
def check_latencies_by_hand(answer) -> Verdict:
    """``answer(trace)`` -> DataFrame indexed by request_id with columns ttft, tpot, e2e."""
    if (verdict := not_a_function(answer, "check('07.1', latencies_by_hand)")) is not None:
        return verdict
    for name, trace in checker_traces().items():
        got, error = call_reader(answer, trace)
        if error:
            return Verdict("wrong", f"on the {name} trace {error}")
        if not isinstance(got, pd.DataFrame) or not {"ttft", "tpot", "e2e"} <= set(got.columns):
            return Verdict("wrong",
                           "return a DataFrame with columns ttft, tpot, e2e, indexed by request_id")
        expected = expected_latencies(trace)
        if sorted(map(str, got.index)) != list(expected.index):
            return Verdict("wrong",
                           f"on the {name} trace: the index must be the finished requests' ids "
                                    f"({len(expected)} of them), got {len(got)} rows")
        got = got.loc[expected.index, ["ttft", "tpot", "e2e"]]
        verdict = compare(got.to_numpy(dtype=float), expected.to_numpy(dtype=float), rtol=1e-9,
                          atol=1e-9, what=f"latencies on the {name} trace")
        if not verdict.ok:
            hint = (" (a non-streaming client sees every token when the batch ends: "
                    "use visible_time)"
                    if name == "dynamic_non_streaming" else "")
            return Verdict("wrong", verdict.message + hint)
    return Verdict("correct", "TTFT, TPOT and E2E match on a streaming, a non-streaming and a "
                              "mixed-length trace")


# --- 07.2 ----------------------------------------------------------------------------------------
def expected_llmperf_itl(trace: Trace) -> float:
    """LLMPerf's inter-token latency, averaged over requests: (last token - arrival) / n."""
    values = [(t[-1] - arrival) / len(t) for arrival, t in _visible_times(trace).values()]
    return float(np.mean(values))


@exercise("07.2")
def check_llmperf_itl(answer) -> Verdict:
    """``answer(trace)`` -> float: the mean of LLMPerf-style inter-token latency (seconds)."""
    if (verdict := not_a_function(answer, "check('07.2', llmperf_itl)")) is not None:
        return verdict
    for name, trace in checker_traces().items():
        got, error = call_reader(answer, trace)
        if error:
            return Verdict("wrong", f"on the {name} trace {error}")
        verdict = compare(got, expected_llmperf_itl(trace), rtol=1e-9,
                          what=f"mean LLMPerf ITL on the {name} trace")
        if not verdict.ok:
            return Verdict("wrong", verdict.message + " (LLMPerf counts the wait for the first "
                                                     "token too, and divides by every token)")
    return Verdict("correct", "your LLMPerf-style ITL matches on all three traces")


# --- 07.3 ----------------------------------------------------------------------------------------
SHARES_3 = (0.5, 0.9, 0.99)


def expected_ttft_slo(trace: Trace, share: float) -> float:
    """The smallest bound b with at least ``share`` of finished requests having TTFT <= b: the
    k-th smallest TTFT, k = ceil(share * n) (a tiny tolerance guards share * n's rounding)."""
    ttfts = np.sort([t[0] - arrival for arrival, t in _visible_times(trace).values()])
    k = max(1, math.ceil(share * len(ttfts) - 1e-9))
    return float(ttfts[k - 1])


@exercise("07.3")
def check_smallest_ttft_slo(answer) -> Verdict:
    """``answer(trace, share)`` -> the smallest TTFT SLO (seconds) that at least ``share`` of the
    finished requests meet."""
    if (verdict := not_a_function(answer, "check('07.3', smallest_ttft_slo)")) is not None:
        return verdict
    for name, trace in checker_traces().items():
        for share in SHARES_3:
            got, error = call_reader(answer, trace, share)
            if error:
                return Verdict("wrong", f"on the {name} trace, share={share}: {error}")
            verdict = compare(got, expected_ttft_slo(trace, share), rtol=1e-9,
                              what=f"TTFT SLO for share={share} on the {name} trace")
            if not verdict.ok:
                return Verdict("wrong",
                               verdict.message + " (an SLO that fewer requests meet is too "
                                                         "small; a larger one is not the smallest)")
    return Verdict("correct", "your SLOs are the smallest that each share of requests meets")
