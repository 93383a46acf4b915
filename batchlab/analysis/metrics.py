"""Serving metrics from a ``Trace``: what a benchmark client would have measured.

The rules and their reasons: ``docs/workloads-and-metrics.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

from batchlab.checks import (check_choice, check_fraction, check_instance, check_list, check_number,
                             fail)
from batchlab.requests import RequestStatus
from batchlab.trace import RequestRecord, Trace

LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2e", "queue_time")
DEFAULT_PERCENTILES: tuple[float, ...] = (50, 90, 95, 99)

PER_REQUEST_COLUMNS: list[str] = [
    "request_id", "arrival_time", "prompt_len", "num_output_tokens", "streamed",
    "first_scheduled_time", "first_token_time", "last_token_time",
    "queue_time", "ttft", "tpot", "itl_max", "e2e", "release_wait",
]


# --- validation helpers ------------------------------------------------------------------------
def _check_trace(trace: Trace) -> None:
    """A trace must be a ``Trace`` with at least one request to be measured."""
    check_instance("trace", trace, Trace, "a batchlab Trace")
    if not trace.requests:
        raise ValueError("the trace has no requests, so there is nothing to measure; "
                         "run a workload with at least one request")


def check_percentiles(percentiles: Iterable[float]) -> tuple[float, ...]:
    """Validate percentiles: a non-empty collection of numbers in [0, 100]. Returns them as
    floats."""
    values = check_list("percentiles", percentiles, "a non-empty sequence of numbers in [0, 100]",
                        hint="e.g. (50, 90, 99)")
    for i, p in enumerate(values):
        check_number(f"percentiles[{i}]", p, 0, maximum=100,
                     hint="use e.g. 99 for the 99th percentile, not 0.99 or 990")
    return tuple(float(p) for p in values)


def percentile_column(p: float) -> str:
    """Column name for a percentile: 50 -> 'p50', 99.9 -> 'p99.9'."""
    return f"p{p:g}"


# --- SLOs --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SLO:
    """Service-level objectives: upper bounds in seconds. ``None`` means "no bound on this metric".

    A request meets the SLO when every given bound holds: ``ttft <= self.ttft``,
    ``tpot <= self.tpot`` (a 1-token request has no TPOT and passes) and ``e2e <= self.e2e``.
    """

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def __post_init__(self) -> None:
        given = {f.name: getattr(self, f.name) for f in fields(self)
                 if getattr(self, f.name) is not None}
        if not given:
            raise ValueError("an SLO needs at least one bound: ttft, tpot or e2e (seconds)")
        for name, bound in given.items():
            check_number(f"SLO.{name}", bound, strict=True, hint="seconds")

    @classmethod
    def coerce(cls, slo: "SLO | Mapping[str, float]") -> "SLO":
        """Accept an ``SLO`` or a dict like ``{"ttft": 0.5, "e2e": 4.0}`` (seconds)."""
        if isinstance(slo, SLO):
            return slo
        if isinstance(slo, Mapping):
            allowed = {f.name for f in fields(cls)}
            unknown = set(slo) - allowed
            if unknown:
                fail("slo", slo, f"a dict with keys from {sorted(allowed)}",
                     f"unknown SLO key(s) {sorted(unknown)}; bounds in seconds")
            return cls(**slo)
        fail("slo", slo, "an SLO or a dict with keys ttft/tpot/e2e", "bounds in seconds")

    def met(self, per_request: pd.DataFrame) -> pd.Series:
        """Boolean Series: which rows of ``per_request_metrics(...)`` meet every bound."""
        ok = pd.Series(True, index=per_request.index)
        if self.ttft is not None:
            ok &= per_request["ttft"] <= self.ttft
        if self.tpot is not None:
            # NaN TPOT (1-token output) passes, as vLLM counts it as 0 for goodput.
            ok &= per_request["tpot"].isna() | (per_request["tpot"] <= self.tpot)
        if self.e2e is not None:
            ok &= per_request["e2e"] <= self.e2e
        return ok


# --- per-request view ---------------------------------------------------------------------------
def _finished(trace: Trace) -> list[RequestRecord]:
    """Finished requests; a finished request must have produced at least one token."""
    done = [r for r in trace.requests if r.status == RequestStatus.FINISHED]
    for r in done:
        if not r.token_times:
            raise ValueError(f"request {r.request_id!r} is marked finished but has no output "
                             "tokens; the trace is inconsistent")
    return done


def request_counts(trace: Trace) -> dict[str, int]:
    """How many requests were submitted, finished, rejected, and left unfinished."""
    _check_trace(trace)
    statuses = [RequestStatus(r.status) for r in trace.requests]
    finished = sum(s == RequestStatus.FINISHED for s in statuses)
    rejected = sum(s == RequestStatus.REJECTED for s in statuses)
    return {"num_requests": len(statuses), "num_finished": finished, "num_rejected": rejected,
            "num_unfinished": len(statuses) - finished - rejected}


def per_request_metrics(trace: Trace) -> pd.DataFrame:
    """One row per finished request, with its latencies in seconds.

    Columns: ``request_id``, ``arrival_time``, ``prompt_len``, ``num_output_tokens``, ``streamed``,
    ``first_scheduled_time``, ``first_token_time`` / ``last_token_time`` (first and last *visible*
    token), ``queue_time``, ``ttft``, ``tpot`` (NaN for 1-token outputs), ``itl_max`` (the request's
    longest gap between visible tokens, NaN for 1 token), ``e2e``, and ``release_wait`` (time the
    finished response waited before the client saw its last token: 0 when streamed, the wait for
    the batch to end for a non-streaming request-level batcher).

    Rejected and unfinished requests are left out (see ``request_counts``).
    """
    _check_trace(trace)
    rows = []
    for r in _finished(trace):
        visible = np.asarray(r.visible_token_times, dtype=float)   # (n,)
        n = len(visible)
        ttft = visible[0] - r.arrival_time
        e2e = visible[-1] - r.arrival_time
        rows.append({
            "request_id": r.request_id, "arrival_time": r.arrival_time,
            "prompt_len": r.prompt_len, "num_output_tokens": n, "streamed": r.streamed,
            "first_scheduled_time": (np.nan if r.first_scheduled_time is None
                                     else r.first_scheduled_time),
            "first_token_time": visible[0], "last_token_time": visible[-1],
            "queue_time": (np.nan if r.first_scheduled_time is None
                           else r.first_scheduled_time - r.arrival_time),
            "ttft": ttft,
            "tpot": (e2e - ttft) / (n - 1) if n > 1 else np.nan,
            "itl_max": float(np.diff(visible).max()) if n > 1 else np.nan,
            "e2e": e2e,
            "release_wait": visible[-1] - r.token_times[-1],
        })
    df = pd.DataFrame(rows, columns=PER_REQUEST_COLUMNS)
    float_cols = [c for c in PER_REQUEST_COLUMNS
                  if c not in ("request_id", "prompt_len", "num_output_tokens", "streamed")]
    return df.astype({c: float for c in float_cols})


def steps_waited(trace: Trace) -> pd.Series:
    """How many engine steps each finished request waited through before its first scheduling,
    indexed by ``request_id``: the step ends (instants when any request in the trace got a token)
    after its arrival and before it was first scheduled. 0: scheduled at once; 1: it waited for
    the step in progress. Works on a server's trace, which has token times but no step records;
    a step that gave nobody in the trace a token is not counted."""
    _check_trace(trace)
    done = [r for r in _finished(trace) if r.first_scheduled_time is not None]
    ends = np.unique(np.concatenate([np.asarray(r.token_times, dtype=float) for r in done]
                                    or [np.empty(0)]))
    counts = [max(0, int(np.searchsorted(ends, r.first_scheduled_time, "left")
                         - np.searchsorted(ends, r.arrival_time, "right"))) for r in done]
    return pd.Series(counts, index=[r.request_id for r in done], name="steps_waited", dtype=int)


def itl_values(trace: Trace) -> np.ndarray:
    """All gaps between successive visible tokens, pooled over finished requests (seconds).

    A request with ``n`` output tokens contributes ``n - 1`` gaps; shape ``(sum(n - 1),)``.
    """
    _check_trace(trace)
    gaps = [np.diff(np.asarray(r.visible_token_times, dtype=float)) for r in _finished(trace)]
    return np.concatenate(gaps) if gaps else np.empty(0, dtype=float)


# --- run-level rates ------------------------------------------------------------------------------
def benchmark_duration(trace: Trace) -> float:
    """Seconds from the first arrival (any request) to the last release (any finished request)."""
    _check_trace(trace)
    done = _finished(trace)
    if not done:
        counts = request_counts(trace)
        raise ValueError(f"no request finished ({counts['num_rejected']} rejected, "
                         f"{counts['num_unfinished']} unfinished of {counts['num_requests']}), so "
                         "the run has no last release; pass duration= explicitly")
    first_arrival = min(r.arrival_time for r in trace.requests)
    last_release = max(r.visible_token_times[-1] for r in done)
    duration = last_release - first_arrival
    if duration <= 0:
        raise ValueError(f"the run lasts {duration!r} s from first arrival to last release; "
                         "a duration must be > 0 (pass duration= explicitly)")
    return float(duration)


def _resolve_duration(trace: Trace, duration: float | None) -> float:
    if duration is None:
        return benchmark_duration(trace)
    check_number("duration", duration, strict=True, hint="seconds")
    return float(duration)


def throughput(trace: Trace, slo: SLO | Mapping[str, float] | None = None,
               duration: float | None = None) -> pd.Series:
    """Counts and rates of one run, as a Series.

    Index: ``num_requests``, ``num_finished``, ``num_rejected``, ``num_unfinished``,
    ``duration`` (s), ``request_throughput`` (req/s), ``output_throughput`` (tok/s),
    ``total_token_throughput`` (tok/s), and with an SLO also ``num_good`` and ``goodput`` (req/s).
    Only finished requests count towards throughput; ``duration`` defaults to
    ``benchmark_duration(trace)``.
    """
    counts = request_counts(trace)
    dur = _resolve_duration(trace, duration)
    done = _finished(trace)
    output_tokens = sum(r.num_output_tokens for r in done)
    prompt_tokens = sum(r.prompt_len for r in done)
    out: dict[str, float] = {**counts, "duration": dur,
                             "request_throughput": len(done) / dur,
                             "output_throughput": output_tokens / dur,
                             "total_token_throughput": (prompt_tokens + output_tokens) / dur}
    if slo is not None:
        good = int(SLO.coerce(slo).met(per_request_metrics(trace)).sum())
        out["num_good"] = good
        out["goodput"] = good / dur
    return pd.Series(out, name="throughput", dtype=object)


def goodput(trace: Trace, slo: SLO | Mapping[str, float], duration: float | None = None) -> float:
    """Finished requests meeting every bound of ``slo`` per second of ``duration``."""
    return float(throughput(trace, slo=slo, duration=duration)["goodput"])


def slo_attainment(sweep: pd.DataFrame) -> pd.Series:
    """Share of *all* requests of each run (rejected and unfinished ones fail) that met the SLO:
    ``num_good / num_requests``, from a table with those columns (``load_sweep(..., slo=...)``)."""
    missing = {"num_good", "num_requests"} - set(sweep.columns)
    if missing:
        raise ValueError(f"the table lacks {sorted(missing)}: run load_sweep with slo=... to "
                         "count good requests")
    return sweep["num_good"].astype(float) / sweep["num_requests"].astype(float)


def max_rate_meeting_slo(sweep: pd.DataFrame, target: float = 0.9,
                         rate: str = "request_rate") -> float:
    """DistServe's goodput: the highest request rate at which at least ``target`` of the requests
    meet the SLO (Zhong et al., OSDI 2024), read from one policy's load sweep.

    Not vLLM's benchmark goodput (``goodput``: requests meeting every SLO per second of one
    run). Rows are sorted by ``rate``; scanning up, the first rate whose ``slo_attainment`` drops
    below ``target`` ends the search, and the answer is interpolated linearly between it and the
    rate before. NaN when even the lowest swept rate misses the target (the answer lies below the
    sweep); a ValueError when no swept rate misses it (sweep higher rates).
    """
    check_fraction("target", target, hint="a share of requests, e.g. 0.9")
    check_choice("rate", rate, sweep.columns, hint="a column of the sweep")
    if len(sweep) == 0:
        raise ValueError("the sweep is empty: give one row per swept rate")
    ordered = sweep.sort_values(rate)
    rates, share = ordered[rate].to_numpy(float), slo_attainment(ordered).to_numpy()
    if rates[0] <= 0 or np.any(np.diff(rates) <= 0):
        raise ValueError(f"rates {rates.tolist()}: must be > 0 and distinct (one policy's sweep)")
    below = np.flatnonzero(share < target)
    if len(below) == 0:
        raise ValueError(f"every swept rate (up to {rates[-1]:.3g} req/s) met the SLO for at least "
                         f"{target:.0%} of requests; sweep higher rates to find where it stops")
    k = int(below[0])
    if k == 0:
        return float("nan")
    r0, r1, a0, a1 = rates[k - 1], rates[k], share[k - 1], share[k]
    return float(r0 + (a0 - target) / (a0 - a1) * (r1 - r0))


# --- latency statistics ------------------------------------------------------------------------
def _stats(values: np.ndarray, percentiles: tuple[float, ...]) -> dict[str, float]:
    """count, mean, std (ddof=0), min, the percentiles (linear interpolation) and max."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    row: dict[str, float] = {"count": len(values)}
    if len(values) == 0:
        row.update({"mean": np.nan, "std": np.nan, "min": np.nan})
        row.update({percentile_column(p): np.nan for p in percentiles})
        row["max"] = np.nan
        return row
    row.update({"mean": float(values.mean()), "std": float(values.std()),
                "min": float(values.min())})
    row.update({percentile_column(p): float(v)
                for p, v in zip(percentiles, np.percentile(values, percentiles))})
    row["max"] = float(values.max())
    return row


def latency_values(trace: Trace, metric: str) -> np.ndarray:
    """The population a latency statistic is computed over: one value per finished request for
    ``ttft``, ``tpot`` (requests with >1 token), ``e2e``, ``queue_time``; every pooled gap for
    ``itl``."""
    check_choice("metric", metric, LATENCY_METRICS)
    if metric == "itl":
        return itl_values(trace)
    values = per_request_metrics(trace)[metric].to_numpy(dtype=float)
    return values[~np.isnan(values)]


def summarize(trace: Trace, slo: SLO | Mapping[str, float] | None = None,
              percentiles: Iterable[float] = DEFAULT_PERCENTILES,
              duration: float | None = None) -> pd.DataFrame:
    """Latency statistics of one run (seconds): rows ``ttft``, ``tpot``, ``itl``, ``e2e``,
    ``queue_time``; columns ``count``, ``mean``, ``std``, ``min``, one per percentile (``p50``...),
    ``max``.

    The run's counts, throughput and (with ``slo``) goodput ride along as a plain dict in
    ``df.attrs["throughput"]`` (the values of ``throughput(trace, slo, duration)``; a dict, not a
    Series, so that ``pd.concat`` of several summaries can compare their attrs).
    Raises ``ValueError`` when no request finished.
    """
    pcts = check_percentiles(percentiles)
    per_request = per_request_metrics(trace)
    if per_request.empty:
        counts = request_counts(trace)
        raise ValueError(f"no request finished ({counts['num_rejected']} rejected, "
                         f"{counts['num_unfinished']} unfinished of {counts['num_requests']}); "
                         "there are no latencies to summarize")
    rows = {}
    for metric in LATENCY_METRICS:
        values = itl_values(trace) if metric == "itl" else per_request[metric].to_numpy(dtype=float)
        rows[metric] = _stats(values, pcts)
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.index.name = "metric"
    df["count"] = df["count"].astype(int)
    df.attrs["throughput"] = throughput(trace, slo=slo, duration=duration).to_dict()
    return df


# --- device view ---------------------------------------------------------------------------------
def _step_arrays(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(durations, num_seqs, num_tokens, held_slots) per step, each shape (num_steps,)."""
    check_instance("trace", trace, Trace, "a batchlab Trace")
    if not trace.steps:
        raise ValueError("the trace has no steps, so there is no device activity to measure")
    durations = np.array([s.duration for s in trace.steps], dtype=float)
    num_seqs = np.array([s.num_seqs for s in trace.steps], dtype=float)
    num_tokens = np.array([s.num_tokens for s in trace.steps], dtype=float)
    held = np.array([s.held_slots for s in trace.steps], dtype=float)
    if durations.sum() <= 0:
        raise ValueError("every step has zero duration, so time-weighted averages are undefined")
    return durations, num_seqs, num_tokens, held


def busy_share(trace: Trace, duration: float | None = None) -> float:
    """Fraction of the run's duration the device spent computing steps."""
    durations, *_ = _step_arrays(trace)
    return float(durations.sum() / _resolve_duration(trace, duration))


def mean_batch_occupancy(trace: Trace) -> float:
    """Average sequences per step, weighted by step duration (idle time is not counted)."""
    durations, num_seqs, _, _ = _step_arrays(trace)
    return float((num_seqs * durations).sum() / durations.sum())


def slot_waste(trace: Trace) -> float:
    """Share of slot-time held by finished members of unfinished request-level batches:
    ``sum(held_slots * d) / sum((num_seqs + held_slots) * d)``. 0 for continuous batching."""
    durations, num_seqs, _, held = _step_arrays(trace)
    total = ((num_seqs + held) * durations).sum()
    return float((held * durations).sum() / total) if total > 0 else 0.0


def device_stats(trace: Trace, duration: float | None = None) -> pd.Series:
    """``num_steps``, ``busy_time`` (s), ``busy_share``, ``mean_num_seqs`` and ``mean_num_tokens``
    (time-weighted over busy time), ``slot_waste``."""
    durations, num_seqs, num_tokens, _ = _step_arrays(trace)
    return pd.Series({
        "num_steps": len(durations), "busy_time": float(durations.sum()),
        "busy_share": busy_share(trace, duration),
        "mean_num_seqs": mean_batch_occupancy(trace),
        "mean_num_tokens": float((num_tokens * durations).sum() / durations.sum()),
        "slot_waste": slot_waste(trace),
    }, name="device", dtype=object)


def preemption_stats(trace: Trace) -> dict[str, int]:
    """What running out of KV blocks cost (paged KV only; all 0 otherwise): ``num_preemptions``,
    ``num_preempted_requests`` (distinct requests), and ``recomputed_tokens``, the computed tokens
    that preemptions threw away and had to be computed again (before any prefix-cache hits)."""
    _check_trace(trace)
    return {"num_preemptions": len(trace.preemptions),
            "num_preempted_requests": len({p.request_id for p in trace.preemptions}),
            "recomputed_tokens": sum(p.num_computed_tokens for p in trace.preemptions)}


# --- side by side --------------------------------------------------------------------------------
def summary_row(trace: Trace, slo: SLO | Mapping[str, float] | None = None,
                percentiles: Iterable[float] = (50, 90, 99),
                duration: float | None = None) -> dict[str, float]:
    """One flat dict per run: counts, rates, device stats (NaN without steps), and
    ``<metric>_mean`` / ``<metric>_p<q>`` for every latency metric (seconds)."""
    pcts = check_percentiles(percentiles)
    lat = summarize(trace, slo=slo, percentiles=pcts, duration=duration)
    row: dict[str, float] = dict(lat.attrs["throughput"])
    if trace.steps:
        row.update(device_stats(trace, duration))
    else:
        row.update({k: np.nan for k in ("num_steps", "busy_time", "busy_share", "mean_num_seqs",
                                        "mean_num_tokens", "slot_waste")})
    for metric in LATENCY_METRICS:
        row[f"{metric}_mean"] = lat.loc[metric, "mean"]
        for p in pcts:
            col = percentile_column(p)
            row[f"{metric}_{col}"] = lat.loc[metric, col]
    return row


def compare(traces: Mapping[str, Trace], slo: SLO | Mapping[str, float] | None = None,
            percentiles: Iterable[float] = (50, 90, 99), duration: float | None = None,
            label: str = "policy") -> pd.DataFrame:
    """One row per named trace (e.g. one per batching policy), columns from ``summary_row``.

    The name goes in column ``label``; add more columns (``request_rate``...) and ``pd.concat``
    several of these to build a load-sweep table for ``plots.plot_load_curve``.
    """
    if not isinstance(traces, Mapping) or not traces:
        fail("traces", traces, "a non-empty dict of {name: Trace}")
    rows = []
    for name, trace in traces.items():
        try:
            rows.append({label: name, **summary_row(trace, slo, percentiles, duration)})
        except ValueError as err:
            raise ValueError(f"trace {name!r}: {err}") from err
    df = pd.DataFrame(rows)
    return df.infer_objects()


# --- what other tools call ITL and TPOT -----------------------------------------------------------
def _weighted_inverse_cdf(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """GuideLLM's weighted percentile: sort the values, turn weights into probabilities, and
    return the first value whose cumulative probability reaches ``q`` (no interpolation)."""
    order = np.argsort(values, kind="stable")
    values, weights = values[order], weights[order]
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if len(values) == 0:
        return np.nan
    cdf = np.cumsum(weights) / weights.sum()
    idx = min(int(np.searchsorted(cdf, q, side="left")), len(values) - 1)
    return float(values[idx])


def itl_definitions(trace: Trace, percentiles: Iterable[float] = (50, 99)) -> pd.DataFrame:
    """The same trace measured with each tool's own "ITL" / "TPOT" (seconds), side by side.

    Rows (index ``definition``):

    * ``vllm_itl`` -- vLLM ``vllm bench serve`` "ITL": every gap between successive streamed
      *chunks*, pooled over requests; plain mean and ``np.percentile``. The client appends one gap
      per chunk it receives after the first (``vllm/benchmarks/lib/endpoint_request_func.py``:
      ``output.itl.append(timestamp - most_recent_timestamp)``; ``vllm/benchmarks/serve.py``,
      ``calculate_metrics``: ``itls += outputs[i].itl``). A chunk is the tokens that became visible
      at the same moment: with one token per chunk these are the gaps between tokens; a response
      handed over whole has none.
    * ``vllm_tpot`` -- vLLM "TPOT (excl. 1st token)": per request ``(E2E - TTFT) / (n - 1)`` for
      ``n > 1``; one value per request. (same function.)
    * ``llmperf_inter_token_latency`` -- LLMPerf ``inter_token_latency_s``: per request, the sum of
      ``time_to_next_token`` -- whose first entry is the TTFT -- divided by the number of output
      tokens, i.e. ``(t_n - arrival) / n``: the first token's wait *is* included. Statistics are
      pandas quantiles (linear) over requests. (``ray-project/llmperf``:
      ``src/llmperf/ray_clients/openai_chat_completions_client.py`` builds the sum,
      ``token_benchmark_ray.py`` divides by the tokenizer-counted output length; here ``n`` is the
      trace's token count.)
    * ``guidellm_inter_token_latency`` -- GuideLLM ``inter_token_latency_ms``: per request
      ``(t_n - t_1) / (n - 1)`` (first token excluded, same value as vLLM's TPOT), but the
      distribution weights each request by ``n - 1`` tokens, so its mean equals the pooled mean
      of vLLM's ITL, and percentiles are weighted inverse-CDF values (no interpolation).
    * ``guidellm_time_per_output_token`` -- GuideLLM ``time_per_output_token_ms``: per request
      ``(t_n - arrival) / n`` (first token *included*, like LLMPerf's ITL), weighted by ``n``.
      (``vllm-project/guidellm``: ``src/guidellm/schemas/request_stats.py``,
      ``GenerativeRequestStats``; weights in
      ``src/guidellm/benchmark/schemas/generative/metrics.py``, ``GenerativeMetrics.compile``;
      weighted percentiles in ``src/guidellm/schemas/statistics.py``,
      ``DistributionSummary.from_values`` / ``Percentiles.from_pdf``.)

    Columns: ``tool``, ``reported_as``, ``formula``, ``includes_first_token``, ``population``,
    ``count``, ``mean``, and one column per percentile. GuideLLM reports milliseconds and LLMPerf
    seconds; all values here are seconds. Requests are timed from their arrival, as if each tool's
    client sent the request at that moment.
    """
    _check_trace(trace)
    pcts = check_percentiles(percentiles)
    done = _finished(trace)
    visible = [np.asarray(r.visible_token_times, dtype=float) for r in done]
    n = np.array([len(v) for v in visible], dtype=float)
    arrival = np.array([r.arrival_time for r in done], dtype=float)
    first = np.array([v[0] for v in visible], dtype=float)
    last = np.array([v[-1] for v in visible], dtype=float)
    multi = n > 1

    chunk_gaps = (np.concatenate([np.diff(np.unique(v)) for v in visible]) if visible
                  else np.empty(0))
    vllm_tpot = ((last - first)[multi] / (n[multi] - 1))
    llmperf = (last - arrival) / n if len(n) else np.empty(0)
    guide_itl, guide_itl_w = vllm_tpot, n[multi] - 1
    guide_tpot, guide_tpot_w = llmperf, n

    def plain(values: np.ndarray) -> dict[str, float]:
        stats = _stats(values, pcts)
        return {"count": stats["count"], "mean": stats["mean"],
                **{percentile_column(p): stats[percentile_column(p)] for p in pcts}}

    def weighted(values: np.ndarray, weights: np.ndarray) -> dict[str, float]:
        if len(values) == 0 or weights.sum() <= 0:
            return {"count": 0, "mean": np.nan, **{percentile_column(p): np.nan for p in pcts}}
        return {"count": int(round(weights.sum())),
                "mean": float((values * weights).sum() / weights.sum()),
                **{percentile_column(p): _weighted_inverse_cdf(values, weights, p / 100)
                   for p in pcts}}

    rows = [
        {"definition": "vllm_itl", "tool": "vLLM bench serve", "reported_as": "ITL",
         "formula": "chunk[i+1] - chunk[i], every gap", "includes_first_token": False,
         "population": "all chunk gaps pooled", **plain(chunk_gaps)},
        {"definition": "vllm_tpot", "tool": "vLLM bench serve", "reported_as": "TPOT",
         "formula": "(E2E - TTFT) / (n - 1)", "includes_first_token": False,
         "population": "one per request with n > 1", **plain(vllm_tpot)},
        {"definition": "llmperf_inter_token_latency", "tool": "LLMPerf",
         "reported_as": "inter_token_latency_s", "formula": "(t[n] - arrival) / n",
         "includes_first_token": True, "population": "one per request", **plain(llmperf)},
        {"definition": "guidellm_inter_token_latency", "tool": "GuideLLM",
         "reported_as": "inter_token_latency_ms", "formula": "(t[n] - t[1]) / (n - 1)",
         "includes_first_token": False, "population": "per request, weighted by n - 1",
         **weighted(guide_itl, guide_itl_w)},
        {"definition": "guidellm_time_per_output_token", "tool": "GuideLLM",
         "reported_as": "time_per_output_token_ms", "formula": "(t[n] - arrival) / n",
         "includes_first_token": True, "population": "per request, weighted by n",
         **weighted(guide_tpot, guide_tpot_w)},
    ]
    return pd.DataFrame(rows).set_index("definition")
