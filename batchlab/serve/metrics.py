"""``GET /metrics``: the server's numbers in Prometheus' text format, with vLLM's names.

Names, meanings, labels (``model_name``, ``engine``) and histogram buckets follow vLLM 0.32's
``PrometheusStatLogger`` in ``vllm/v1/metrics/loggers.py``, with the bucket bounds of
``vllm/v1/metrics/buckets.py``, so a dashboard or a scraper written for vLLM reads batchlab's
server unchanged (``batchlab.loadgen.prom`` reads either into a DataFrame).

When each number moves (the engine's thread calls these between steps; a scrape reads the rest):

- every token: ``vllm:generation_tokens``; a request's first token: ``vllm:prompt_tokens`` (its
  prompt), ``vllm:prefix_cache_queries`` (with prefix caching: the tokens looked up) and, when
  the token is visible at once (a streaming policy), ``vllm:time_to_first_token_seconds`` from
  the request's arrival; every later token: ``vllm:inter_token_latency_seconds``, the gap to the
  token before. A policy that hands responses back whole observes TTFT at the release and ITL
  gaps of 0 (what its clients see, as ``batchlab.analysis.metrics`` counts them).
- a preemption: ``vllm:num_preemptions``; with prefix caching the re-admission looks up prompt +
  output so far, counted in ``vllm:prefix_cache_queries`` (as vLLM does).
- a finished request: ``vllm:request_success{finished_reason}``, ``vllm:e2e_request_latency_seconds``
  (arrival → last visible token), ``vllm:request_queue_time_seconds`` (arrival → first step),
  ``_prefill_time`` (first step → first token), ``_decode_time`` (first → last token),
  ``_inference_time`` (first step → last token), ``vllm:request_time_per_output_token_seconds``
  (decode time / (n - 1), 0 for one token, as vLLM), and the token-count histograms. Aborted
  requests count in ``request_success{finished_reason="abort"}`` only.
- at scrape time, read from the engine: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (1.0 = full), ``vllm:prefix_cache_hits`` (counted by the KV
  cache at admission; queries are counted at the first token, so mid-prefill a scrape can see
  a request's hits before its queries).
- requests refused with 429 (``--max-waiting``): ``vllm:admission_rejections{reason="max_num_queued_reqs"}``.

Counters are cumulative over the server's life, whatever the trace window forgets.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from batchlab.serve.engine_view import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vllm/v1/metrics/buckets.py (vLLM 0.32)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                           60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                               5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


# (attribute, vLLM's name, its help text, buckets; None: the token-count buckets up to max_model_len)
HISTOGRAMS = (
    ("ttft", "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
     TIME_TO_FIRST_TOKEN_BUCKETS),
    ("itl", "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
     INTER_TOKEN_LATENCY_BUCKETS),
    ("tpot", "vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
     INTER_TOKEN_LATENCY_BUCKETS),
    ("e2e", "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS),
    ("queue", "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
     REQUEST_LATENCY_BUCKETS),
    ("inference", "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
     REQUEST_LATENCY_BUCKETS),
    ("prefill", "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
     REQUEST_LATENCY_BUCKETS),
    ("decode", "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
     REQUEST_LATENCY_BUCKETS),
    ("prompt_hist", "vllm:request_prompt_tokens", "Number of prefill tokens processed.", None),
    ("generation_hist", "vllm:request_generation_tokens", "Number of generation tokens processed.", None),
    ("max_tokens_hist", "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", None),
)


def request_tokens_buckets(max_model_len: int) -> list[int]:
    """vLLM's ``build_1_2_5_buckets(max_model_len)``: 1, 2, 5, 10, 20, 50, ... up to the window."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return out
            out.append(m * scale)
        scale *= 10


class _EngineCollector(Collector):
    """The numbers read from the engine at scrape time."""

    def __init__(self, read_stats: Callable[[], EngineStats], labels: dict[str, str]) -> None:
        self.read_stats, self.labels = read_stats, labels

    def collect(self):
        s = self.read_stats()
        names, values = list(self.labels), list(self.labels.values())
        for name, doc, value in (
                ("vllm:num_requests_running", "Number of requests in model execution batches.", s.num_running),
                ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.num_waiting),
                ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                 s.kv_used_tokens / s.kv_capacity_tokens if s.kv_capacity_tokens else 0.0)):
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            yield family
        hits = CounterMetricFamily("vllm:prefix_cache_hits",
                                   "Prefix cache hits, in terms of number of cached tokens.", labels=names)
        hits.add_metric(values, s.prefix_cache_hit_tokens)
        yield hits


class ServerMetrics:
    """The server's Prometheus registry: fed by the engine thread, read by ``GET /metrics``."""

    ttft: Histogram            # the histograms, made from HISTOGRAMS
    itl: Histogram
    tpot: Histogram
    e2e: Histogram
    queue: Histogram
    inference: Histogram
    prefill: Histogram
    decode: Histogram
    prompt_hist: Histogram
    generation_hist: Histogram
    max_tokens_hist: Histogram

    def __init__(self, model_name: str, max_model_len: int, read_stats: Callable[[], EngineStats]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"model_name": model_name, "engine": "0"}
        names = list(labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=self.registry).labels(**labels)

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=self.registry).labels(**labels)

        token_buckets = request_tokens_buckets(max_model_len)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          names + ["finished_reason"], registry=self.registry)
        self.success = {r: success.labels(**labels, finished_reason=r) for r in ("stop", "length", "abort")}
        self.rejections = Counter("vllm:admission_rejections",
                                  "Number of admission attempts rejected by a queue limit, by reason.",
                                  ["model_name", "reason"], registry=self.registry).labels(
            model_name=model_name, reason="max_num_queued_reqs")
        for attr, name, doc, buckets in HISTOGRAMS:
            setattr(self, attr, histogram(name, doc, token_buckets if buckets is None else buckets))
        self.registry.register(_EngineCollector(read_stats, labels))

    # --- the engine's thread ------------------------------------------------------------------------
    def token(self, prompt_len: int, arrival: float, t: float, previous: float | None, visible: bool,
              prefix_caching: bool) -> None:
        """A token computed at ``t`` (``previous``: the request's token before, None for its first)."""
        self.generation_tokens.inc()
        if previous is None:
            self.prompt_tokens.inc(prompt_len)
            if prefix_caching:
                self.prefix_queries.inc(prompt_len)
            if visible:
                self.ttft.observe(t - arrival)
        elif visible:
            self.itl.observe(t - previous)

    def preempted(self, num_tokens_to_recompute: int, prefix_caching: bool) -> None:
        self.preemptions.inc()
        if prefix_caching:
            self.prefix_queries.inc(num_tokens_to_recompute)

    def finished(self, finish_reason: str, timings: dict, prompt_len: int, max_tokens: int, streamed: bool) -> None:
        """A request's end, from the server's timings for it (engine clock, seconds)."""
        self.success[finish_reason].inc()
        if finish_reason == "abort":
            return
        arrival, first_step = timings["arrival_time"], timings["first_scheduled_time"]
        computed = timings["token_times"]
        n = len(computed)
        release = timings["release_time"]
        if not streamed:                       # handed back whole: every token visible at release
            self.ttft.observe(release - arrival)
            for _ in range(n - 1):
                self.itl.observe(0.0)
        decode = computed[-1] - computed[0]
        self.e2e.observe((computed[-1] if streamed else release) - arrival)
        self.queue.observe(first_step - arrival)
        self.prefill.observe(computed[0] - first_step)
        self.decode.observe(decode)
        self.inference.observe(computed[-1] - first_step)
        self.tpot.observe(decode / (n - 1) if n > 1 else 0.0)
        self.prompt_hist.observe(prompt_len)
        self.generation_hist.observe(n)
        self.max_tokens_hist.observe(max_tokens)

    # --- the event loop -----------------------------------------------------------------------------
    def refused(self) -> None:
        self.rejections.inc()

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)
