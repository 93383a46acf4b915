"""The numbers of ``vllm bench serve``'s result JSON, computed once for a measured load and a
prediction alike: the counts and rates of a run, and each latency metric's mean, median, std and
percentiles in milliseconds (keys such as ``median_ttft_ms`` and ``p99.9_itl_ms``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentile_key(metric: str, q: float) -> str:
    """vLLM's key for one percentile: ``p99_ttft_ms``, ``p99.9_itl_ms``."""
    word = str(int(q)) if int(q) == q else str(q)
    return f"p{word}_{metric}_ms"


def metric_stats(metric: str, seconds: Sequence[float], percentiles: Sequence[float],
                 empty: float = 0.0) -> dict[str, float]:
    """``mean_``, ``median_``, ``std_`` and ``p<q>_<metric>_ms`` of ``seconds``; each is ``empty``
    when there are no values (vLLM writes 0; a prediction writes NaN, which meets no SLO)."""
    if len(seconds) == 0:
        keys = [f"mean_{metric}_ms", f"median_{metric}_ms", f"std_{metric}_ms"]
        return dict.fromkeys(keys + [percentile_key(metric, q) for q in percentiles], float(empty))
    ms = np.asarray(seconds, dtype=float) * 1e3
    stats = {f"mean_{metric}_ms": float(ms.mean()), f"median_{metric}_ms": float(np.median(ms)),
             f"std_{metric}_ms": float(ms.std())}
    stats.update({percentile_key(metric, q): float(np.percentile(ms, q)) for q in percentiles})
    return stats


def rate_fields(duration: float, completed: int, failed: int, input_tokens: int,
                output_tokens: int) -> dict:
    """The run's counts and rates: requests and tokens per second of ``duration`` (0 if it is 0)."""
    per_s = 1.0 / duration if duration > 0 else 0.0
    return {"duration": duration, "completed": completed, "failed": failed,
            "total_input_tokens": input_tokens, "total_output_tokens": output_tokens,
            "request_throughput": completed * per_s, "output_throughput": output_tokens * per_s,
            "total_token_throughput": (input_tokens + output_tokens) * per_s}


__all__ = ["metric_stats", "percentile_key", "rate_fields"]
