"""Worked solutions for notebook 07 (measuring TTFT, ITL and tails): functions of a trace,
written with pandas on the trace's own tables."""

import math

import numpy as np
import pandas as pd


def latencies_by_hand(trace) -> pd.DataFrame:
    """07.1: TTFT, TPOT and E2E per finished request, from ``tokens_df`` and ``requests_df``.

    What the client saw is ``visible_time`` (for a non-streaming server every token becomes
    visible when the batch ends), and every latency starts at the request's arrival.
    """
    reqs = trace.requests_df()
    reqs = reqs[reqs["status"] == "finished"].set_index("request_id")
    seen = trace.tokens_df().groupby("request_id")["visible_time"]
    first, last, n = seen.min(), seen.max(), seen.size()
    arrival = reqs["arrival_time"]
    out = pd.DataFrame({"ttft": first - arrival, "e2e": last - arrival}).loc[reqs.index]
    tokens = n.loc[reqs.index]
    out["tpot"] = (out["e2e"] - out["ttft"]) / (tokens - 1).where(tokens > 1)
    return out


def llmperf_itl(trace) -> float:
    """07.2: LLMPerf's inter-token latency is, per request, the sum of its token gaps *with the
    wait for the first token as the first gap*, over its number of tokens: E2E / n."""
    lat = latencies_by_hand(trace)
    n = trace.tokens_df().groupby("request_id").size().loc[lat.index]
    return float((lat["e2e"] / n).mean())


def smallest_ttft_slo(trace, share: float) -> float:
    """07.3: sort the TTFTs; the k-th smallest, k = ceil(share * n), is met by exactly k requests
    and any smaller bound is met by fewer."""
    ttft = np.sort(latencies_by_hand(trace)["ttft"].to_numpy())
    k = max(1, math.ceil(share * len(ttft) - 1e-9))
    return float(ttft[k - 1])


def _wrong_latencies(trace) -> pd.DataFrame:
    """Uses when tokens were *computed*, which a non-streaming client never sees."""
    reqs = trace.requests_df()
    reqs = reqs[reqs["status"] == "finished"].set_index("request_id")
    computed = trace.tokens_df().groupby("request_id")["computed_time"]
    out = pd.DataFrame({"ttft": computed.min() - reqs["arrival_time"],
                        "e2e": computed.max() - reqs["arrival_time"]}).loc[reqs.index]
    n = computed.size().loc[reqs.index]
    out["tpot"] = (out["e2e"] - out["ttft"]) / (n - 1).where(n > 1)
    return out


def _wrong_llmperf_itl(trace) -> float:
    """vLLM's TPOT mean: leaves the first token's wait out, unlike LLMPerf."""
    return float(latencies_by_hand(trace)["tpot"].mean())


def _wrong_ttft_slo(trace, share: float) -> float:
    """An interpolated percentile: usually falls between two requests' TTFTs, so it is met by
    fewer than ``share`` of them."""
    return float(np.percentile(latencies_by_hand(trace)["ttft"], 100 * share))


SOLUTIONS = {
    "07.1": lambda: latencies_by_hand,
    "07.2": lambda: llmperf_itl,
    "07.3": lambda: smallest_ttft_slo,
}
WRONG = {"07.1": _wrong_latencies, "07.2": _wrong_llmperf_itl, "07.3": _wrong_ttft_slo}
