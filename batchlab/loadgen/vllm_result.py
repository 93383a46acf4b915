"""``vllm bench serve``'s result JSON (``--save-result``), written from a load and read from
either client.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from batchlab.analysis.bench_json import metric_stats, percentile_key, rate_fields
from batchlab.checks import fail
from batchlab.loadgen.records import ClientRecord

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el", "client_queue_time",
                      "e2el_including_client_queue")
DEFAULT_PERCENTILE_METRICS = "ttft,tpot,itl"
REQUIRED_KEYS = ("duration", "completed", "total_input_tokens", "total_output_tokens",
                 "request_throughput", "output_throughput", "total_token_throughput")
DETAILED_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts",
                 "errors")


def parse_percentile_metrics(text: str) -> list[str]:
    """``--percentile-metrics ttft,tpot,itl,e2el``: names from ``PERCENTILE_METRICS``."""
    names = [m.strip() for m in str(text).split(",")]
    if (not names or not all(m in PERCENTILE_METRICS for m in names)
            or len(set(names)) != len(names)):
        fail("percentile-metrics", text,
             f"distinct comma-separated names from {list(PERCENTILE_METRICS)}",
             "e.g. ttft,tpot,itl,e2el")
    return names


def parse_metric_percentiles(text: str) -> list[float]:
    """``--metric-percentiles 50,90,99``: numbers in (0, 100]."""
    try:
        qs = [float(q) for q in str(text).split(",")]
    except ValueError:
        qs = []
    if not qs or not all(0 < q <= 100 for q in qs):
        fail("metric-percentiles", text, "comma-separated percentiles in (0, 100]", "e.g. 50,90,99")
    return qs


def _completed(r: ClientRecord) -> bool:
    return r.ok and r.send_time is not None and bool(r.chunk_times)


def per_request(records: list[ClientRecord]) -> dict[str, list]:
    """Each completed request's ``ttft``, ``e2el``, ``tpot`` (more than one token) and token
    gaps (``itls``, one list per request), in seconds, and its output tokens."""
    out: dict[str, list] = {"ttft": [], "e2el": [], "tpot": [], "itls": [], "output_len": []}
    for r in records:
        if not _completed(r):
            continue
        times = r.token_times()
        ttft, e2el, n = times[0] - r.send_time, times[-1] - r.send_time, len(times)
        out["ttft"].append(ttft)
        out["e2el"].append(e2el)
        out["itls"].append(np.diff(times).tolist())
        out["output_len"].append(n)
        if n > 1:
            out["tpot"].append((e2el - ttft) / (n - 1))
    return out


def _peaks(records: list[ClientRecord]) -> tuple[float, int]:
    """vLLM's ``max_output_tokens_per_s`` and ``max_concurrent_requests``: the busiest one-second
    bucket."""
    done = [r for r in records if _completed(r)]
    if not done:
        return 0.0, 0
    t0 = min(r.send_time for r in done)
    ends = [r.token_times()[-1] for r in done]
    buckets = int(np.ceil(max(ends) - t0)) + 1
    tokens, running = np.zeros(buckets), np.zeros(buckets)
    for r, end in zip(done, ends):
        for t in r.token_times():
            tokens[int(t - t0)] += 1
        running[int(r.send_time - t0):int(end - t0) + 1] += 1
    return float(tokens.max()), int(running.max())


def result_json(result, *, num_prompts: int, schedule, percentile_metrics: list[str],
                percentiles: list[float],
                slo=None, backend: str = "openai", label: str | None = None,
                tokenizer_id: str | None = None,
                detailed: bool = False, metadata: dict | None = None) -> dict:
    """A ``LoadResult`` as ``vllm bench serve --save-result`` writes it (see the module docstring).
    ``schedule``: the load's ``schedule.Schedule``; ``slo``: the ``--goodput`` bounds, or None."""
    recs = result.records
    done = [r for r in recs if _completed(r)]
    per = per_request(recs)
    input_lens = [r.usage_prompt_tokens or max(r.prompt_len, 0) for r in recs]
    output_lens = [r.num_tokens if _completed(r) else 0 for r in recs]
    total_in = sum(n for r, n in zip(recs, input_lens) if _completed(r))
    total_out = sum(output_lens)
    dur = result.wall_seconds
    rate = schedule.request_rate
    out: dict = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": backend,
                 "backend": backend,
                 "label": label, "model_id": result.model, "tokenizer_id": tokenizer_id,
                 "num_prompts": num_prompts, **(metadata or {}),
                 "request_rate": rate if rate < math.inf else "inf",
                 "burstiness": schedule.burstiness, "max_concurrency": result.max_concurrency}
    if schedule.ramp_up_strategy is not None:
        out.update(ramp_up_strategy=schedule.ramp_up_strategy,
                   ramp_up_start_rps=schedule.ramp_up_start_rps,
                   ramp_up_end_rps=schedule.ramp_up_end_rps)
    peak_tokens, peak_running = _peaks(recs)
    queue = [(r.send_time - r.scheduled_time) if r.send_time is not None else 0.0 for r in recs]
    out.update(rate_fields(dur, len(done), len(recs) - len(done), total_in, total_out))
    out.update({
        "request_goodput": result.goodput(slo) if slo is not None else None,
        "latencies": [(r.token_times()[-1] - r.send_time) if _completed(r) else 0.0 for r in recs],
        "queue_times": queue,
        "max_output_tokens_per_s": peak_tokens, "max_concurrent_requests": peak_running,
        "rtfx": 0.0})
    if detailed:
        out.update({"input_lens": input_lens, "output_lens": output_lens,
                    "ttfts": [r.ttft if _completed(r) else 0.0 for r in recs],
                    "itls": [np.diff(r.token_times()).tolist() if _completed(r) else []
                             for r in recs],
                    "start_times": [r.send_time if r.send_time is not None else 0.0 for r in recs],
                    "generated_texts": [r.text for r in recs],
                    "errors": [r.error or "" for r in recs]})
    values = {"ttft": per["ttft"], "tpot": per["tpot"],
              "itl": [g for gaps in per["itls"] for g in gaps], "e2el": per["e2el"]}
    if result.max_concurrency is not None:
        values["client_queue_time"] = [q for r, q in zip(recs, queue) if _completed(r)]
        if rate < math.inf:
            values["e2el_including_client_queue"] = [
                e + q for e, q in zip(per["e2el"], values["client_queue_time"])]
    for metric in percentile_metrics:
        # the client-queue metrics exist only with --max-concurrency
        if metric in values:
            # (0 when empty, as vLLM)
            out.update(metric_stats(metric, values[metric], percentiles))
    return out


def result_filename(label: str, schedule, max_concurrency: int | None, model_id: str,
                    date: str) -> str:
    """vLLM's default file name: ``{label}-{rate}qps[-concurrency{N}]-{model}-{date}.json``."""
    cap = f"-concurrency{max_concurrency}" if max_concurrency is not None else ""
    return f"{label}-{schedule.label}{cap}-{model_id.split('/')[-1]}-{date}.json"


@dataclass(frozen=True)
class BenchResult:
    """One result file of either client: counts, rates (per second), ``duration_s`` and
    ``latency_ms`` (a row per metric the file has: mean, median, std and its percentiles, ms)."""

    path: str
    completed: int
    failed: int | None
    duration_s: float
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    total_input_tokens: int
    total_output_tokens: int
    request_rate: float
    max_concurrency: int | None
    latency_ms: pd.DataFrame
    raw: dict


def read_result(path: str | Path) -> BenchResult:
    """A ``--save-result`` JSON of ``vllm bench serve`` or ``python -m batchlab.loadgen``."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        fail("result", str(path), "a --save-result JSON file", f"{type(e).__name__}: {e}")
    if not isinstance(raw, dict):
        fail("result", str(path), "a --save-result JSON object",
             f"it holds a JSON {type(raw).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in raw]
    if missing:
        fail("result", str(path), "a vllm bench serve --save-result JSON", f"it lacks {missing}")
    rows: dict[str, dict[str, float]] = {}
    for key, value in raw.items():
        if not key.endswith("_ms") or value is None:
            continue
        # longest first: e2el_including_...
        for metric in sorted(PERCENTILE_METRICS, key=len, reverse=True):
            suffix = f"_{metric}_ms"
            if key.endswith(suffix):
                stat = key[:-len(suffix)]
                if re.fullmatch(r"mean|median|std|p\d+(\.\d+)?", stat):
                    rows.setdefault(metric, {})[stat] = float(value)
                break
    rate = raw.get("request_rate", "inf")
    return BenchResult(str(path), int(raw["completed"]), raw.get("failed"), float(raw["duration"]),
                       float(raw["request_throughput"]), float(raw["output_throughput"]),
                       float(raw["total_token_throughput"]), int(raw["total_input_tokens"]),
                       int(raw["total_output_tokens"]), math.inf if rate == "inf" else float(rate),
                       raw.get("max_concurrency"), pd.DataFrame.from_dict(rows, orient="index"),
                       raw)


METRIC_TITLES = {"ttft": ("TTFT", "Time to First Token"),
                 "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
                 "itl": ("ITL", "Inter-token Latency"), "e2el": ("E2EL", "End-to-end Latency"),
                 "client_queue_time": ("Client Queue Time", "Client-side Queueing"),
                 "e2el_including_client_queue": ("E2EL incl. Client Queue",
                                                 "Queue-inclusive End-to-end Latency")}


def format_result(result: dict, percentile_metrics: list[str], percentiles: list[float]) -> str:
    """The block ``vllm bench serve`` prints, from a ``result_json`` dict."""
    def line(name: str, value) -> str:
        return f"{name:<40}{value:<10.2f}" if isinstance(value, float) else f"{name:<40}{value:<10}"
    rows = ["{:=^50}".format(" Serving Benchmark Result "),
            line("Successful requests:", result["completed"]),
            line("Failed requests:", result["failed"])]
    if result["max_concurrency"] is not None:
        rows.append(line("Maximum request concurrency:", result["max_concurrency"]))
    if result["request_rate"] != "inf":
        rows.append(line("Request rate configured (RPS):", float(result["request_rate"])))
    rows += [line("Benchmark duration (s):", result["duration"]),
             line("Total input tokens:", result["total_input_tokens"]),
             line("Total generated tokens:", result["total_output_tokens"]),
             line("Request throughput (req/s):", result["request_throughput"])]
    if result["request_goodput"] is not None:
        rows.append(line("Request goodput (req/s):", result["request_goodput"]))
    rows += [line("Output token throughput (tok/s):", result["output_throughput"]),
             line("Peak output token throughput (tok/s):", result["max_output_tokens_per_s"]),
             line("Peak concurrent requests:", result["max_concurrent_requests"]),
             line("Total token throughput (tok/s):", result["total_token_throughput"])]
    for metric in percentile_metrics:
        if f"mean_{metric}_ms" not in result:
            continue
        short, title = METRIC_TITLES[metric]
        rows += ["{:-^50}".format(title), line(f"Mean {short} (ms):", result[f"mean_{metric}_ms"]),
                 line(f"Median {short} (ms):", result[f"median_{metric}_ms"])]
        for q in percentiles:
            key = percentile_key(metric, q)
            rows.append(line(f"{key.split('_')[0].upper()} {short} (ms):", result[key]))
    return "\n".join(rows + ["=" * 50])
