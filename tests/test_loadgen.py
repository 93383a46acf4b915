"""The load client: its metrics on chunk timestamps computed by hand, and a short real load on
batchlab's server (open and closed loop)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchlab.analysis.metrics import per_request_metrics, summarize
from batchlab.loadgen import ClientRecord, LoadRequest, LoadResult, chunk_gaps, client_trace, plan_requests, run_load
from batchlab.requests import RequestStatus


def hand_records() -> list[ClientRecord]:
    # A: sent at 1.0; chunks at 1.5 (1 token), 1.7 (2 tokens: a server may pack several), 2.0 (1 token).
    a = ClientRecord("A", 10, 4, 1.0, send_time=1.0, status_code=200, chunk_times=[1.5, 1.7, 2.0],
                     chunk_tokens=[1, 2, 1], end_time=2.1, finish_reason="length")
    # B: sent at 2.0 (scheduled 1.99); one chunk of 3 tokens at 2.4.
    b = ClientRecord("B", 5, 3, 1.99, send_time=2.0, status_code=200, chunk_times=[2.4], chunk_tokens=[3],
                     end_time=2.5, finish_reason="stop")
    # C: refused with 429; D: the stream ended with "abort" after one token.
    c = ClientRecord("C", 5, 3, 2.0, send_time=2.01, status_code=429, end_time=2.02, error="queue full")
    d = ClientRecord("D", 5, 3, 2.1, send_time=2.1, status_code=200, chunk_times=[2.3], chunk_tokens=[1],
                     end_time=2.35, finish_reason="abort")
    return [a, b, c, d]


def test_client_trace_metrics_equal_hand_computed_values():
    trace = client_trace(hand_records())
    statuses = {r.request_id: r.status for r in trace.requests}
    assert statuses == {"A": RequestStatus.FINISHED, "B": RequestStatus.FINISHED,
                        "C": RequestStatus.REJECTED, "D": RequestStatus.ABORTED}
    assert trace.requests[0].token_times == [1.5, 1.7, 1.7, 2.0]      # one time per token
    df = per_request_metrics(trace).set_index("request_id")
    assert list(df.index) == ["A", "B"]                                 # only finished ones
    assert df.loc["A", "ttft"] == pytest.approx(0.5)
    assert df.loc["A", "e2e"] == pytest.approx(1.0)
    assert df.loc["A", "tpot"] == pytest.approx(0.5 / 3)                 # (e2e - ttft) / (4 - 1)
    assert df.loc["B", "ttft"] == pytest.approx(0.4) and df.loc["B", "tpot"] == pytest.approx(0.0)
    table = summarize(trace)
    # ITL per token: A gives 0.2, 0.0, 0.3; B gives 0.0, 0.0 -> 5 gaps.
    assert table.loc["itl", "count"] == 5
    assert table.loc["itl", "mean"] == pytest.approx(0.1)
    assert table.loc["itl", "max"] == pytest.approx(0.3)
    assert table.loc["ttft", "p50"] == pytest.approx(0.45)
    # Per chunk, as a one-token-per-chunk client would see it: A's 0.2 and 0.3 only.
    assert sorted(chunk_gaps(hand_records())) == pytest.approx([0.2, 0.3])
    # Throughput: 7 output tokens of finished requests, from the first send (1.0) to the last visible
    # token of a finished request (2.4).
    tp = table.attrs["throughput"]
    assert tp["num_finished"] == 2 and tp["output_throughput"] == pytest.approx(7 / 1.4)


def test_rate_report_says_when_the_client_fell_behind():
    on_time = [ClientRecord(f"r{i}", 5, 1, i * 0.1, send_time=i * 0.1 + 0.001, status_code=200,
                            chunk_times=[i * 0.1 + 0.05], chunk_tokens=[1], end_time=i * 0.1 + 0.06,
                            finish_reason="length") for i in range(11)]
    rr = LoadResult(on_time, "open", "u", "m", None, 10.0, 1.0).rate_report()
    assert rr["planned_rate"] == pytest.approx(10.0) and rr["achieved_rate"] == pytest.approx(10.0)
    assert rr["behind"] is False and rr["all_sent"] is True
    late = [ClientRecord(f"r{i}", 5, 1, i * 0.1, send_time=i * 0.2, status_code=200) for i in range(11)]
    rr = LoadResult(late, "open", "u", "m", None, 10.0, 1.0).rate_report()
    assert rr["achieved_rate"] == pytest.approx(5.0) and rr["behind"] is True
    assert rr["send_lag_max_s"] == pytest.approx(1.0)


def test_load_request_checks_its_fields():
    with pytest.raises(ValueError, match="max_tokens"):
        LoadRequest("a", "hi", 0)
    with pytest.raises(ValueError, match="prompt"):
        LoadRequest("a", "", 3)
    with pytest.raises(ValueError, match="closed loop needs"):
        run_load("http://127.0.0.1:9", [LoadRequest("a", "hi", 3)], mode="closed")


@pytest.fixture(scope="module")
def server(lm):
    from batchlab.serve import ServerConfig, ServerThread
    with ServerThread(ServerConfig(max_num_seqs=8, max_model_len=128), lm) as s:
        yield s


def test_open_and_closed_loop_against_batchlab(server, lm):
    reqs = plan_requests(6, prompt_len=16, output_len=5, tokenizer=lm.tokenizer, arrival="poisson", rate=20.0, seed=3)
    result = run_load(server.url, reqs, mode="open", target_rate=20.0, max_duration=120)
    assert all(r.ok for r in result.records), result.status_counts()
    assert all(r.num_tokens == 5 and r.tokens_counted_by == "usage" for r in result.records)
    rr = result.rate_report()
    assert rr["all_sent"] and rr["num_sent"] == 6 and not math.isnan(rr["achieved_rate"])
    table = result.table()
    assert set(["ttft", "tpot", "itl", "e2e", "queue_time"]) <= set(table.index)
    assert table.loc["ttft", "count"] == 6 and table.loc["queue_time", "count"] == 6   # server times joined
    engine = result.server_trace()
    assert [r.output_ids for r in engine.requests] == [r.output_ids for r in result.trace.requests]
    # The engine's first token comes before the client sees it, and after the client sent the request.
    for c, e in zip(result.trace.requests, engine.requests):
        assert c.arrival_time <= e.arrival_time + 0.005 and e.token_times[0] <= c.token_times[0] + 0.005
    closed = run_load(server.url, reqs, mode="closed", concurrency=2, max_duration=120)
    assert all(r.ok for r in closed.records)
    starts = sorted(r.send_time for r in closed.records)
    ends = sorted(r.end_time for r in closed.records)
    # Never more than 2 in flight: the third request is sent only after the first one ended.
    assert starts[2] >= ends[0] - 1e-6
    assert np.all(np.array([r.scheduled_time for r in closed.records]) >= 0)


def test_replay_keeps_the_workload_files_arrival_times_and_lengths(lm):
    from batchlab.loadgen import replay_requests
    from batchlab.workloads import load_workload
    path = "data/chat_poisson_cpu.jsonl"
    reqs = replay_requests(path, lm.tokenizer)
    source = load_workload(path)
    assert [(r.request_id, r.arrival_time, r.max_tokens, len(r.prompt)) for r in reqs] == \
        [(s.request_id, s.arrival_time, s.max_new_tokens, s.prompt_len) for s in source]
    gamma = plan_requests(50, prompt_len=8, output_len=2, tokenizer=lm.tokenizer, arrival="gamma", rate=5.0,
                          burstiness=0.25, seed=1)
    gaps = np.diff([r.arrival_time for r in gamma])
    assert gaps.std() / gaps.mean() > 1.3          # gamma shape 0.25: coefficient of variation 2
