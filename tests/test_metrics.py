"""Metrics against small traces worked out by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from batchlab.analysis.metrics import (
    SLO,
    benchmark_duration,
    busy_share,
    check_percentiles,
    compare,
    device_stats,
    goodput,
    itl_definitions,
    itl_values,
    latency_values,
    mean_batch_occupancy,
    per_request_metrics,
    request_counts,
    slot_waste,
    steps_waited,
    summarize,
    throughput,
)
from batchlab.plan import ScheduledChunk
from batchlab.requests import RequestStatus
from batchlab.trace import RequestRecord, StepRecord, Trace


# --- hand-built traces ---------------------------------------------------------------------------
def record(rid: str, arrival: float, token_times: list[float], *, streamed: bool = True,
           release: float | None = None, first_scheduled: float | None = None, prompt_len: int = 4,
           status: RequestStatus = RequestStatus.FINISHED) -> RequestRecord:
    """A request record; a streamed request is released with its last token."""
    if release is None and streamed and token_times:
        release = token_times[-1]
    return RequestRecord(
        request_id=rid, arrival_time=arrival, prompt_len=prompt_len,
        max_new_tokens=max(1, len(token_times)), status=status,
        finish_reason=("length" if status == RequestStatus.FINISHED else
                       "needs more KV than the cache holds" if status == RequestStatus.REJECTED else None),
        first_scheduled_time=first_scheduled, token_times=list(token_times), release_time=release,
        streamed=streamed)


def three_request_trace() -> Trace:
    """A (3 tokens), B (2 tokens), C (1 token), all streamed, and one rejected request R.

    request  arrival  scheduled  visible tokens   prompt
    A        0.0      0.5        1, 2, 4          10
    B        1.0      1.0        2, 2.5           6
    C        0.0      2.0        3                4
    R        0.2      -          (rejected)       100
    """
    return Trace(requests=[
        record("A", 0.0, [1.0, 2.0, 4.0], first_scheduled=0.5, prompt_len=10),
        record("B", 1.0, [2.0, 2.5], first_scheduled=1.0, prompt_len=6),
        record("C", 0.0, [3.0], first_scheduled=2.0, prompt_len=4),
        record("R", 0.2, [], prompt_len=100, status=RequestStatus.REJECTED),
    ])


def stepped_trace() -> Trace:
    """Four steps with an idle gap and one held slot; one request spans the run (0 to 6 s).

    step  start  duration  chunks                     held
    0     0      1         2 prefill chunks (4 tok)   0
    1     1      1         2 decodes                  0
    2     2      2         1 decode                   1
    3     5      1         1 decode                   0     (idle 4..5)
    """
    pre = [ScheduledChunk("A", 0, 4, True), ScheduledChunk("B", 0, 4, True)]
    dec = lambda rid, pos: ScheduledChunk(rid, pos, 1, True)  # noqa: E731
    steps = [
        StepRecord(0, 0.0, 1.0, pre),
        StepRecord(1, 1.0, 1.0, [dec("A", 4), dec("B", 4)]),
        StepRecord(2, 2.0, 2.0, [dec("A", 5)], held_slots=1),
        StepRecord(3, 5.0, 1.0, [dec("A", 6)]),
    ]
    reqs = [record("A", 0.0, [1.0, 2.0, 4.0, 6.0], first_scheduled=0.0),
            record("B", 0.0, [1.0, 2.0], first_scheduled=0.0)]
    return Trace(requests=reqs, steps=steps)


# --- per-request metrics ---------------------------------------------------------------------------
def test_per_request_metrics_by_hand():
    df = per_request_metrics(three_request_trace()).set_index("request_id")
    assert list(df.index) == ["A", "B", "C"]          # R is rejected: left out
    # A: ttft = 1 - 0 = 1, e2e = 4 - 0 = 4, tpot = (4 - 1) / (3 - 1) = 1.5, queue = 0.5 - 0
    assert df.loc["A", ["ttft", "e2e", "tpot", "queue_time", "itl_max"]].tolist() == [1.0, 4.0, 1.5, 0.5, 2.0]
    # B: ttft = 2 - 1 = 1, e2e = 2.5 - 1 = 1.5, tpot = 0.5 / 1 = 0.5, queue = 0
    assert df.loc["B", ["ttft", "e2e", "tpot", "queue_time", "itl_max"]].tolist() == [1.0, 1.5, 0.5, 0.0, 0.5]
    # C: one token, so TPOT and the longest gap are undefined
    assert df.loc["C", "ttft"] == 3.0 and df.loc["C", "e2e"] == 3.0 and df.loc["C", "queue_time"] == 2.0
    assert math.isnan(df.loc["C", "tpot"]) and math.isnan(df.loc["C", "itl_max"])
    assert (df["release_wait"] == 0).all()            # streamed: nothing waits
    assert df["num_output_tokens"].tolist() == [3, 2, 1]


def test_itl_values_pool_every_gap():
    # A: gaps 1, 2; B: gap 0.5; C: none
    assert itl_values(three_request_trace()).tolist() == [1.0, 2.0, 0.5]


def test_steps_waited_counts_the_step_ends_between_arrival_and_first_scheduling():
    # step ends seen in the token times: 1, 2, 2.5, 3, 4 (R, rejected, has none and is left out)
    # A: (0, 0.5) holds none; B: arrived and was scheduled at 1.0, itself an end; C: (0, 2) holds 1.0
    assert steps_waited(three_request_trace()).to_dict() == {"A": 0, "B": 0, "C": 1}
    late = Trace(requests=[record("X", 0.0, [1.0, 2.0, 3.0, 4.0], first_scheduled=0.0),
                           record("Y", 0.5, [3.5], first_scheduled=3.2)])      # ends 1, 2, 3 passed
    assert steps_waited(late).to_dict() == {"X": 0, "Y": 3}


def test_streamed_vs_non_streamed_ttft():
    # Same computed tokens at 1, 2, 3 s; the non-streaming server releases the batch at 5 s.
    streamed = Trace(requests=[record("S", 0.0, [1.0, 2.0, 3.0], first_scheduled=0.0)])
    batched = Trace(requests=[record("N", 0.0, [1.0, 2.0, 3.0], streamed=False, release=5.0,
                                     first_scheduled=0.0)])
    s = per_request_metrics(streamed).iloc[0]
    n = per_request_metrics(batched).iloc[0]
    assert (s["ttft"], s["e2e"], s["tpot"], s["release_wait"]) == (1.0, 3.0, 1.0, 0.0)
    # non-streamed: every token visible at 5 s -> TTFT = E2E = 5, TPOT = 0, waited 5 - 3 = 2 s
    assert (n["ttft"], n["e2e"], n["tpot"], n["release_wait"]) == (5.0, 5.0, 0.0, 2.0)
    assert itl_values(streamed).tolist() == [1.0, 1.0]
    assert itl_values(batched).tolist() == [0.0, 0.0]


# --- run-level rates -----------------------------------------------------------------------------
def test_counts_duration_and_throughput():
    trace = three_request_trace()
    assert request_counts(trace) == {"num_requests": 4, "num_finished": 3, "num_rejected": 1,
                                     "num_unfinished": 0}
    # first arrival 0 (A, C) to last release 4 (A)
    assert benchmark_duration(trace) == 4.0
    t = throughput(trace)
    assert t["request_throughput"] == pytest.approx(3 / 4)
    assert t["output_throughput"] == pytest.approx((3 + 2 + 1) / 4)               # 1.5 tok/s
    assert t["total_token_throughput"] == pytest.approx((10 + 6 + 4 + 6) / 4)     # 6.5 tok/s; R's 100 excluded
    assert "goodput" not in t.index
    # an explicit duration replaces the measured one
    assert throughput(trace, duration=8.0)["request_throughput"] == pytest.approx(3 / 8)


def test_duration_starts_at_the_first_arrival_even_if_rejected():
    # R arrives first (0 s) and is rejected; A arrives at 1 s and is released at 3 s.
    trace = Trace(requests=[record("R", 0.0, [], status=RequestStatus.REJECTED),
                            record("A", 1.0, [2.0, 3.0])])
    assert benchmark_duration(trace) == 3.0     # 0 -> 3, not 1 -> 3
    assert throughput(trace)["request_throughput"] == pytest.approx(1 / 3)


def test_unfinished_requests_are_counted_not_measured():
    trace = three_request_trace()
    trace.requests.append(record("U", 0.1, [3.5], first_scheduled=3.0, status=RequestStatus.RUNNING))
    assert request_counts(trace)["num_unfinished"] == 1
    assert "U" not in per_request_metrics(trace)["request_id"].tolist()
    assert throughput(trace)["request_throughput"] == pytest.approx(3 / 4)


@pytest.mark.parametrize("slo, good", [
    ({"ttft": 1.0}, 2),                 # A (1 <= 1) and B (1) pass, C (3) fails
    ({"ttft": 2.0, "tpot": 1.0}, 1),    # A fails tpot 1.5, C fails ttft 3; only B
    ({"tpot": 1.0}, 2),                 # B passes, C has no TPOT and passes, A fails
    ({"e2e": 3.0}, 2),                  # B (1.5) and C (3 <= 3) pass, A (4) fails
    (SLO(ttft=0.5), 0),
])
def test_goodput_with_slos(slo, good):
    trace = three_request_trace()
    t = throughput(trace, slo=slo)
    assert t["num_good"] == good
    assert t["goodput"] == pytest.approx(good / 4.0)     # duration 4 s
    assert goodput(trace, slo) == pytest.approx(good / 4.0)


def test_slo_validation():
    with pytest.raises(ValueError, match="at least one bound"):
        SLO()
    with pytest.raises(ValueError, match="SLO.ttft=-1; must be a finite number > 0"):
        SLO(ttft=-1)
    with pytest.raises(ValueError, match=r"slo=\{'ttft_ms': 500\}; must be a dict with keys from .*unknown"):
        SLO.coerce({"ttft_ms": 500})
    with pytest.raises(ValueError, match="slo=0.5; must be an SLO or a dict"):
        SLO.coerce(0.5)


# --- summaries -----------------------------------------------------------------------------------
def test_summarize_by_hand():
    df = summarize(three_request_trace(), slo={"ttft": 1.0}, percentiles=(50, 90))
    assert list(df.index) == ["ttft", "tpot", "itl", "e2e", "queue_time"]
    assert list(df.columns) == ["count", "mean", "std", "min", "p50", "p90", "max"]
    # TTFT values 1, 1, 3: mean 5/3; p50 = 1; p90 at rank 0.9 * 2 = 1.8 -> 1 + 0.8 * (3 - 1) = 2.6
    assert df.loc["ttft", "count"] == 3
    assert df.loc["ttft", "mean"] == pytest.approx(5 / 3)
    assert df.loc["ttft", "p50"] == pytest.approx(1.0)
    assert df.loc["ttft", "p90"] == pytest.approx(2.6)
    # TPOT 1.5, 0.5 (C has one token): mean 1.0, std 0.5 (population)
    assert df.loc["tpot", ["count", "mean", "std"]].tolist() == pytest.approx([2, 1.0, 0.5])
    # ITL gaps 1, 2, 0.5: mean 3.5 / 3
    assert df.loc["itl", "count"] == 3 and df.loc["itl", "mean"] == pytest.approx(3.5 / 3)
    # E2E 4, 1.5, 3: mean 8.5 / 3, median 3
    assert df.loc["e2e", "mean"] == pytest.approx(8.5 / 3) and df.loc["e2e", "p50"] == 3.0
    # queue 0.5, 0, 2
    assert df.loc["queue_time", "max"] == 2.0 and df.loc["queue_time", "min"] == 0.0
    rates = df.attrs["throughput"]
    assert rates["num_rejected"] == 1 and rates["goodput"] == pytest.approx(2 / 4)
    # summaries of several runs stack into one table
    both = pd.concat([df, summarize(stepped_trace(), percentiles=(50, 90))], keys=["a", "b"])
    assert both.loc[("b", "e2e"), "max"] == 6.0


def test_summarize_single_token_outputs_have_no_tpot():
    trace = Trace(requests=[record("X", 0.0, [1.0]), record("Y", 0.5, [2.0])])
    df = summarize(trace)
    assert df.loc["tpot", "count"] == 0 and math.isnan(df.loc["tpot", "mean"])
    assert df.loc["itl", "count"] == 0
    assert df.loc["ttft", "mean"] == pytest.approx((1.0 + 1.5) / 2)


def test_compare_side_by_side():
    a, b = three_request_trace(), stepped_trace()
    table = compare({"static": a, "continuous": b}, slo={"e2e": 3.0}, percentiles=(50, 99))
    assert table["policy"].tolist() == ["static", "continuous"]
    row = table.set_index("policy").loc["static"]
    assert row["ttft_mean"] == pytest.approx(5 / 3)
    assert row["e2e_p50"] == pytest.approx(3.0)
    assert row["request_throughput"] == pytest.approx(3 / 4)
    assert row["goodput"] == pytest.approx(2 / 4)
    assert math.isnan(row["busy_share"])                         # no steps recorded in trace a
    assert table.set_index("policy").loc["continuous", "slot_waste"] == pytest.approx(2 / 9)
    for col in ("itl_p99", "tpot_p50", "queue_time_mean", "total_token_throughput"):
        assert col in table.columns
    with pytest.raises(ValueError, match="non-empty dict"):
        compare({})


# --- device view -----------------------------------------------------------------------------------
def test_device_stats_by_hand():
    trace = stepped_trace()
    # busy 1 + 1 + 2 + 1 = 5 s of a 6 s run (arrival 0 to last release 6)
    assert busy_share(trace) == pytest.approx(5 / 6)
    # sequences weighted by time: (2*1 + 2*1 + 1*2 + 1*1) / 5 = 7/5
    assert mean_batch_occupancy(trace) == pytest.approx(1.4)
    # held slot-time 1*2 over all slot-time (2*1 + 2*1 + (1+1)*2 + 1*1) = 2/9
    assert slot_waste(trace) == pytest.approx(2 / 9)
    stats = device_stats(trace)
    assert stats["busy_time"] == 5.0 and stats["num_steps"] == 4
    # tokens weighted by time: (8*1 + 2*1 + 1*2 + 1*1) / 5 = 13/5
    assert stats["mean_num_tokens"] == pytest.approx(2.6)


def test_device_stats_need_steps():
    with pytest.raises(ValueError, match="no steps"):
        mean_batch_occupancy(three_request_trace())


# --- the other tools' ITL ------------------------------------------------------------------------
def test_itl_definitions_by_hand():
    df = itl_definitions(three_request_trace(), percentiles=(50, 99))
    # vLLM ITL: gaps [1, 2, 0.5]; mean 3.5/3; median 1; p99 at rank 1.98 of [0.5, 1, 2] -> 1.98
    assert df.loc["vllm_itl", ["count", "mean", "p50", "p99"]].tolist() == \
        pytest.approx([3, 3.5 / 3, 1.0, 1.98])
    # vLLM TPOT: A 1.5, B 0.5 -> mean 1, median 1, p99 = 0.5 + 0.99 * 1 = 1.49
    assert df.loc["vllm_tpot", ["count", "mean", "p50", "p99"]].tolist() == \
        pytest.approx([2, 1.0, 1.0, 1.49])
    # LLMPerf: (last - arrival) / n: A 4/3, B 1.5/2 = 0.75, C 3/1 = 3 (first token included)
    # mean (4/3 + 0.75 + 3) / 3; median 4/3; p99 at rank 1.98 -> 4/3 + 0.98 * (3 - 4/3)
    assert df.loc["llmperf_inter_token_latency", ["count", "mean", "p50", "p99"]].tolist() == \
        pytest.approx([3, (4 / 3 + 0.75 + 3) / 3, 4 / 3, 4 / 3 + 0.98 * (5 / 3)])
    # GuideLLM ITL: A 1.5 (weight 2), B 0.5 (weight 1): mean (3 + 0.5) / 3 = pooled vLLM mean;
    # cumulative probability 0.5 -> 1/3, 1.5 -> 1: both p50 and p99 land on 1.5
    assert df.loc["guidellm_inter_token_latency", ["count", "mean", "p50", "p99"]].tolist() == \
        pytest.approx([3, 3.5 / 3, 1.5, 1.5])
    # GuideLLM TPOT: B 0.75 (w 2), A 4/3 (w 3), C 3 (w 1): mean (1.5 + 4 + 3) / 6 = 8.5/6;
    # cumulative 2/6, 5/6, 1 -> p50 = 4/3, p99 = 3
    assert df.loc["guidellm_time_per_output_token", ["count", "mean", "p50", "p99"]].tolist() == \
        pytest.approx([6, 8.5 / 6, 4 / 3, 3.0])
    assert df.loc["llmperf_inter_token_latency", "includes_first_token"]
    assert not df.loc["vllm_itl", "includes_first_token"]


def test_vllm_itl_counts_chunks_not_tokens():
    # Tokens 2-3 arrive in one chunk at 2.0 s: vLLM's client sees two gaps (1.0, 2.0), where a
    # per-token count would add a 0-second gap; a response handed over whole has no gaps at all.
    chunked = Trace(requests=[record("a", 0.0, [1.0, 2.0, 2.0, 4.0])])
    df = itl_definitions(chunked, percentiles=(50,))
    assert df.loc["vllm_itl", ["count", "mean"]].tolist() == pytest.approx([2, 1.5])
    assert df.loc["vllm_tpot", "mean"] == pytest.approx(1.0)          # (4 - 1) / (4 - 1) tokens
    whole = Trace(requests=[record("b", 0.0, [3.0, 3.0, 3.0])])
    assert itl_definitions(whole).loc["vllm_itl", "count"] == 0


def test_guidellm_percentile_takes_a_value_not_an_interpolation():
    # Two 2-token requests with gaps 1 and 3 s. vLLM interpolates its median: (1 + 3) / 2 = 2.
    # GuideLLM's weights are 1 and 1, cumulative probability 0.5 and 1: the first value whose
    # cumulative probability reaches 0.5 is 1.
    trace = Trace(requests=[record("a", 0.0, [1.0, 2.0]), record("b", 0.0, [1.0, 4.0])])
    df = itl_definitions(trace, percentiles=(50,))
    assert df.loc["vllm_itl", "p50"] == pytest.approx(2.0)
    assert df.loc["guidellm_inter_token_latency", "p50"] == pytest.approx(1.0)


def test_guidellm_mean_itl_equals_pooled_vllm_itl_on_random_trace():
    rng = np.random.default_rng(0)
    reqs = []
    for i in range(50):
        arrival = float(rng.uniform(0, 10))
        n = int(rng.integers(1, 30))
        times = arrival + np.cumsum(rng.exponential(0.05, size=n)) + float(rng.uniform(0, 1))
        reqs.append(record(f"r{i}", arrival, times.tolist()))
    df = itl_definitions(Trace(requests=reqs))
    assert df.loc["guidellm_inter_token_latency", "mean"] == pytest.approx(df.loc["vllm_itl", "mean"])
    # with the first token's wait included, LLMPerf's number is larger than vLLM's TPOT mean
    assert df.loc["llmperf_inter_token_latency", "mean"] > df.loc["vllm_tpot", "mean"]


# --- validation -----------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [per_request_metrics, itl_values, summarize, throughput,
                                benchmark_duration, itl_definitions, request_counts, steps_waited])
def test_empty_trace_is_a_clear_error(fn):
    with pytest.raises(ValueError, match="no requests"):
        fn(Trace())


def test_not_a_trace_is_a_type_error():
    with pytest.raises(ValueError, match=r"trace=\[1, 2, 3\]; must be a batchlab Trace \(got list\)"):
        per_request_metrics([1, 2, 3])


def test_no_finished_request():
    trace = Trace(requests=[record("R", 0.0, [], status=RequestStatus.REJECTED)])
    df = per_request_metrics(trace)
    assert df.empty and "ttft" in df.columns
    with pytest.raises(ValueError, match="1 rejected"):
        summarize(trace)
    with pytest.raises(ValueError, match="duration="):
        throughput(trace)


@pytest.mark.parametrize("bad, message", [
    ((50, 101), r"percentiles\[1\]=101; must be a finite number in \[0, 100\]"),
    ((-1,), r"percentiles\[0\]=-1;"), ((float("nan"),), r"percentiles\[0\]=nan;"),
    ((), r"percentiles=\[\]; must be a non-empty sequence"), ("50", "percentiles='50'; must be"),
    ((True,), r"percentiles\[0\]=True;"), (("p99",), r"percentiles\[0\]='p99';"), (50, "percentiles=50;"),
])
def test_bad_percentiles(bad, message):
    with pytest.raises(ValueError, match=message):
        summarize(three_request_trace(), percentiles=bad)


def test_good_percentiles_pass_through():
    assert check_percentiles([0, 99.9, 100]) == (0.0, 99.9, 100.0)
    assert "p99.9" in summarize(three_request_trace(), percentiles=(99.9,)).columns


@pytest.mark.parametrize("bad", [0, -2.0, float("inf"), "4"])
def test_bad_duration(bad):
    with pytest.raises(ValueError, match="duration"):
        throughput(three_request_trace(), duration=bad)


def test_latency_values_population():
    trace = three_request_trace()
    assert latency_values(trace, "itl").tolist() == [1.0, 2.0, 0.5]
    assert latency_values(trace, "tpot").tolist() == [1.5, 0.5]
    with pytest.raises(ValueError, match=r"metric='latency'; must be one of \['ttft'"):
        latency_values(trace, "latency")


def test_finished_request_without_tokens_is_inconsistent():
    trace = Trace(requests=[record("Z", 0.0, [])])
    with pytest.raises(ValueError, match="no output tokens"):
        per_request_metrics(trace)


def test_per_request_frame_types():
    df = per_request_metrics(three_request_trace())
    assert df["ttft"].dtype == float and df["num_output_tokens"].dtype.kind == "i"
    assert isinstance(df, pd.DataFrame)
