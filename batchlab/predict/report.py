"""A prediction's results: latency percentiles, throughput, KV use, preemptions, and a verdict.

The rules and their reasons: ``docs/predicting-a-deployment.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from batchlab.analysis.bench_json import metric_stats, rate_fields
from batchlab.analysis.metrics import (itl_values, per_request_metrics, preemption_stats,
                                       request_counts)
from batchlab.trace import Trace

SATURATION_SLOPE = 0.02
SATURATION_WAIT_S = 0.5
# vLLM's name -> batchlab's
METRICS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}


@dataclass
class Prediction:
    """What ``predict`` returns: the run's trace and the facts it was predicted from."""

    trace: Trace
    setup: dict
    kv_capacity_tokens: int
    wall_seconds: float
    percentiles: tuple[float, ...] = (50, 90, 99)
    _per_request: pd.DataFrame | None = field(default=None, repr=False)

    @property
    def per_request(self) -> pd.DataFrame:
        if self._per_request is None:
            self._per_request = per_request_metrics(self.trace)
        return self._per_request

    def values(self, metric: str) -> np.ndarray:
        """Seconds: one per finished request (``ttft``, ``tpot``, ``e2el``), every gap for
        ``itl``."""
        if metric == "itl":
            return itl_values(self.trace)
        return self.per_request[METRICS[metric]].dropna().to_numpy(float)

    def saturation(self) -> dict:
        """``saturated`` (bool; None when every request arrived at once: no rate to keep up with),
        the queue's ``slope`` and the last fifth's median ``late_wait_s``."""
        df = self.per_request.sort_values("arrival_time")
        t, q = df["arrival_time"].to_numpy(float), df["queue_time"].fillna(0).to_numpy(float)
        late = float(np.median(q[len(q) * 4 // 5:])) if len(q) else 0.0
        if len(t) < 3 or np.ptp(t) == 0:
            return {"saturated": None, "slope": float("nan"), "late_wait_s": late}
        slope = float(np.polyfit(t, q, 1)[0])
        return {"saturated": slope > SATURATION_SLOPE and late > SATURATION_WAIT_S, "slope": slope,
                "late_wait_s": late}

    def kv_usage(self, num_samples: int = 256) -> dict:
        """The KV tokens held by running requests, as a share of the capacity: ``mean`` and
        ``peak`` over ``num_samples`` instants (a shared prefix counted once per request: an upper
        bound where prefixes are cached)."""
        df = self.per_request
        start, first = (df["first_scheduled_time"].to_numpy(float),
                        df["first_token_time"].to_numpy(float))
        end, prompt = df["last_token_time"].to_numpy(float), df["prompt_len"].to_numpy(float)
        rate = (df["num_output_tokens"].to_numpy(float) - 1) / np.maximum(end - first, 1e-12)
        held = [np.where((t >= start) & (t < end), prompt + np.clip(t - first, 0, None) * rate,
                         0.0).sum() for t in np.linspace(start.min(), end.max(), num_samples)]
        # one instant at a time: memory stays O(requests)
        share = np.asarray(held) / self.kv_capacity_tokens
        return {"mean": float(share.mean()), "peak": float(share.max())}

    def bench_result(self) -> dict:
        """``vllm bench serve``'s result keys and units for this prediction."""
        counts, df = request_counts(self.trace), self.per_request
        duration = (float(df["last_token_time"].max() - self.trace.requests[0].arrival_time)
                    if len(df) else 0.0)
        inputs, outputs = int(df["prompt_len"].sum()), int(df["num_output_tokens"].sum())
        out = {"backend": "batchlab.predict", "model_id": self.setup["model"],
               "num_prompts": counts["num_requests"], "request_rate": self.setup.get("request_rate",
                                              "trace"), "burstiness": self.setup.get("burstiness"),
               **rate_fields(duration, counts["num_finished"],
                             counts["num_requests"] - counts["num_finished"], inputs, outputs)}
        for name in METRICS:
            out.update(metric_stats(name, self.values(name), self.percentiles, empty=float("nan")))
        return out

    def summary_lines(self) -> list[str]:
        """The prediction in words: percentiles, throughput, KV, preemptions, verdict."""
        r, sat, kv = self.bench_result(), self.saturation(), self.kv_usage()
        head = (f"{'metric':>8} {'mean':>10} "
                + " ".join(f"{'p' + format(p, 'g'):>10}" for p in self.percentiles))
        lines = [head]
        for name in METRICS:
            lines.append(f"{name.upper():>8} {r[f'mean_{name}_ms']:8.1f}ms "
                         + " ".join(f"{r[f'p{p:g}_{name}_ms']:8.1f}ms" for p in self.percentiles))
        pre = preemption_stats(self.trace)
        lines += [f"throughput: {r['request_throughput']:.2f} req/s, "
                  f"{r['output_throughput']:,.0f} output tok/s "
                  f"({r['completed']:,} of {r['num_prompts']:,} requests finished "
                  f"over {r['duration']:.1f} s)",
                  f"KV cache: {kv['mean']:.0%} held on average, {kv['peak']:.0%} at the peak; "
                  f"{pre['num_preemptions']} preemptions",
                  self._verdict(sat)]
        return lines

    @staticmethod
    def _verdict(sat: dict) -> str:
        if sat["saturated"] is None:
            return (f"verdict: none - every request arrived at once, so there is no rate to "
                    f"keep up with (the last fifth waited {sat['late_wait_s']:.1f} s in the "
                    f"queue at the median); give --request-rate")
        if sat["saturated"]:
            return (f"verdict: SATURATED - the queue grows by {sat['slope']:.2f} s per second of "
                    f"arrivals (the last fifth waited {sat['late_wait_s']:.1f} s at the median): "
                    "the deployment serves under the offered rate")
        return (f"verdict: keeps up (queue wait of the last fifth "
                f"{sat['late_wait_s'] * 1e3:.0f} ms at the median)")


__all__ = ["METRICS", "SATURATION_SLOPE", "SATURATION_WAIT_S", "Prediction"]
