"""``GET /metrics``: the server's numbers in Prometheus' text format, with vLLM's names.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from batchlab.serve.engine_view import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vllm/v1/metrics/buckets.py (vLLM 0.32)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                               1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

# vLLM 0.32's label values (FinishReason in vllm/v1/engine/__init__.py; loggers.py; stats.py;
# cache_hit_source.py), every one shown from the start as vLLM does
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
WAITING_REASONS = ("capacity", "deferred")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
PROMPT_TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
ADMISSION_REASON = "max_waiting"           # batchlab's own rule (see the module docstring)
VLLM_ADMISSION_FLAG = "--max-num-queued-reqs"   # vLLM's, a different rule: waiting + running, 503


# (attribute, vLLM's name, its help text, buckets; None: token-count buckets up to max_model_len)
HISTOGRAMS = (
    ("ttft", "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
     TIME_TO_FIRST_TOKEN_BUCKETS),
    ("itl", "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
     INTER_TOKEN_LATENCY_BUCKETS),
    ("tpot", "vllm:request_time_per_output_token_seconds",
     "Histogram of time_per_output_token_seconds per request.", INTER_TOKEN_LATENCY_BUCKETS),
    ("e2e", "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
     REQUEST_LATENCY_BUCKETS),
    ("queue", "vllm:request_queue_time_seconds",
     "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS),
    ("inference", "vllm:request_inference_time_seconds",
     "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS),
    ("prefill", "vllm:request_prefill_time_seconds",
     "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS),
    ("decode", "vllm:request_decode_time_seconds",
     "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS),
    ("prompt_hist", "vllm:request_prompt_tokens", "Number of prefill tokens processed.", None),
    ("generation_hist", "vllm:request_generation_tokens", "Number of generation tokens processed.",
     None),
    ("max_tokens_hist", "vllm:request_params_max_tokens",
     "Histogram of the max_tokens request parameter.", None),
    ("max_generation_hist", "vllm:request_max_num_generation_tokens",
     "Histogram of maximum number of requested generation tokens.", None),
    ("iteration", "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
     ITERATION_TOKENS_BUCKETS),
)

# vLLM's help texts of the families made at scrape time, with labels
WAITING_REASON_DOC = ("Number of waiting requests by reason. Reason labels: 'capacity' = waiting "
                      "for scheduling capacity; 'deferred' = deferred by transient constraints "
                      "(LoRA budget, KV transfer, blocked status). Sum of all reasons equals "
                      "vllm:num_requests_waiting.")
SLEEP_STATE_DOC = ("Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine "
                   "is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means "
                   "sleep level 2.")
CACHED_BY_SOURCE_DOC = ("Prefix-cache hit tokens by the cache tier that supplied them: device "
                        "(local HBM), host (offloaded to DRAM), disk, p2p (transferred from "
                        "another vLLM instance) or external_unspecified. Counted at admission; "
                        "sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.")


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
                ("vllm:num_requests_running", "Number of requests in model execution batches.",
                 s.num_running),
                ("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                 s.num_waiting),
                ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                 s.kv_used_tokens / s.kv_capacity_tokens if s.kv_capacity_tokens else 0.0)):
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            yield family
        # every waiting request waits for capacity: batchlab defers none (no LoRA, no KV transfer)
        yield self._labelled(GaugeMetricFamily, "vllm:num_requests_waiting_by_reason",
                             WAITING_REASON_DOC, "reason",
                             dict(zip(WAITING_REASONS, (s.num_waiting, 0))))
        # batchlab has no sleep mode: always awake (see the module docstring)
        yield self._labelled(GaugeMetricFamily, "vllm:engine_sleep_state", SLEEP_STATE_DOC,
                             "sleep_state", dict(zip(SLEEP_STATES, (1, 0, 0))))
        hits = CounterMetricFamily("vllm:prefix_cache_hits",
                                   "Prefix cache hits, in terms of number of cached tokens.",
                                   labels=names)
        hits.add_metric(values, s.prefix_cache_hit_tokens)
        yield hits
        # every prefix-cache hit is served from the device's own KV blocks
        yield self._labelled(CounterMetricFamily, "vllm:prompt_tokens_cached_by_source",
                             CACHED_BY_SOURCE_DOC,
                             "source", {src: s.prefix_cache_hit_tokens if src == "device" else 0
                                        for src in CACHE_HIT_SOURCES})

    def _labelled(self, kind, name: str, doc: str, label: str, by_value: dict):
        family = kind(name, doc, labels=list(self.labels) + [label])
        for key, value in by_value.items():
            family.add_metric(list(self.labels.values()) + [key], value)
        return family


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
    max_generation_hist: Histogram
    iteration: Histogram

    def __init__(self, model_name: str, max_model_len: int, read_stats: Callable[[], EngineStats],
                 num_speculative_tokens: int = 0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"model_name": model_name, "engine": "0"}
        names = list(labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=self.registry).labels(**labels)

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets,
                             registry=self.registry).labels(**labels)

        token_buckets = request_tokens_buckets(max_model_len)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens",
                                         "Number of generation tokens processed.")
        self.preemptions = counter("vllm:num_preemptions",
                                   "Cumulative number of preemption from the engine.")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.")
        by_source = Counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                            names + ["source"], registry=self.registry)
        self.prompt_by_source = {src: by_source.labels(**labels, source=src)
                                 for src in PROMPT_TOKEN_SOURCES}
        self.prompt_cached = counter("vllm:prompt_tokens_cached",
                                     "Number of cached prompt tokens (local + external).")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          names + ["finished_reason"], registry=self.registry)
        self.success = {r: success.labels(**labels, finished_reason=r) for r in FINISH_REASONS}
        self.rejections = Counter("vllm:admission_rejections",
                                  "Number of admission attempts rejected by a queue limit, "
                                  "by reason.",
                                  ["model_name", "reason"], registry=self.registry).labels(
            model_name=model_name, reason=ADMISSION_REASON)
        for attr, name, doc, buckets in HISTOGRAMS:
            setattr(self, attr, histogram(name, doc, token_buckets if buckets is None else buckets))
        self.registry.register(_EngineCollector(read_stats, labels))
        self.spec = (self._spec_counters(counter, labels, num_speculative_tokens)
                     if num_speculative_tokens else None)

    def _spec_counters(self, counter: Callable[[str, str], Counter], labels: dict[str, str],
                       num_speculative_tokens: int) -> tuple:
        """Drafts, draft tokens, accepted tokens, and accepted tokens per draft position (vLLM
        shows these only with a speculative config)."""
        per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                          "Accepted tokens per draft position.",
                          list(labels) + ["position"], registry=self.registry)
        return (counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
                counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
                counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
                [per_pos.labels(**labels, position=str(i))
                 for i in range(num_speculative_tokens)])

    # --- the engine's thread ---------------------------------------------------------------------
    def step(self, num_tokens: int) -> None:
        """An engine step that computed ``num_tokens`` tokens."""
        self.iteration.observe(num_tokens)

    def token(self, prompt_len: int, arrival: float, t: float, previous: float | None,
              visible: bool, prefix_caching: bool, cached: int = 0, external: int = 0,
              num_tokens: int = 1) -> None:
        """A request's ``num_tokens`` tokens of one step, computed at ``t`` (``previous``: the
        request's token before, None for its first; ``cached``: the prompt tokens its first
        admission found in the prefix cache; ``external``: those whose KV a disaggregated prefill
        worker sent). Several tokens (a checked draft) are one inter-token gap, as vLLM counts."""
        self.generation_tokens.inc(num_tokens)
        if previous is None:
            self.prompt_tokens.inc(prompt_len)
            cached = min(cached, prompt_len)
            external = min(external, prompt_len - cached)
            self.prompt_by_source["local_compute"].inc(prompt_len - cached - external)
            self.prompt_by_source["local_cache_hit"].inc(cached)
            self.prompt_by_source["external_kv_transfer"].inc(external)
            self.prompt_cached.inc(cached + external)
            if prefix_caching:
                self.prefix_queries.inc(prompt_len)
            if visible:
                self.ttft.observe(t - arrival)
        elif visible:
            self.itl.observe(t - previous)

    def checked(self, drafted: int, accepted: int) -> None:
        """A step checked a draft of ``drafted`` tokens and accepted the first ``accepted``."""
        drafts, draft_tokens, accepted_tokens, per_pos = self.spec
        drafts.inc()
        draft_tokens.inc(drafted)
        accepted_tokens.inc(accepted)
        for counter in per_pos[:accepted]:
            counter.inc()

    def preempted(self, num_tokens_to_recompute: int, prefix_caching: bool) -> None:
        self.preemptions.inc()
        if prefix_caching:
            self.prefix_queries.inc(num_tokens_to_recompute)

    def finished(self, finish_reason: str, timings: dict, prompt_len: int, max_tokens: int,
                 streamed: bool) -> None:
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
        self.max_generation_hist.observe(n)            # the largest of the request's n = 1 samples
        self.max_tokens_hist.observe(max_tokens)

    def failed(self, num_requests: int) -> None:
        """The engine thread failed with ``num_requests`` requests in flight: each ends in error."""
        self.success["error"].inc(num_requests)

    # --- the event loop --------------------------------------------------------------------------
    def refused(self) -> None:
        self.rejections.inc()

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)
