"""The load client: its metrics on chunk timestamps computed by hand, and a short real load on
batchlab's server (open and closed loop)."""

from __future__ import annotations

import json
import math
import threading

import numpy as np
import pandas as pd
import pytest

from batchlab.analysis import metrics

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


# --- bad input: one clear error naming the value -------------------------------------------------------
def test_bad_options_raise_one_valueerror_naming_the_value(tmp_path):
    from batchlab.loadgen import parse_goodput, parse_rates, read_prompts
    from batchlab.serve import free_port
    one = [LoadRequest("a", "hi", 3)]
    with pytest.raises(ValueError, match=r"endpoint='embeddings'; must be one of \['completions', 'chat'\]"):
        run_load("http://127.0.0.1:9", one, endpoint="embeddings")
    for text in ("2,x", "0,1", "-1", "", "2,2"):
        with pytest.raises(ValueError, match=r"rates=.*; must be distinct positive numbers"):
            parse_rates(text)
    with pytest.raises(ValueError, match=r"goodput='itl:50'; must be KEY:MS with KEY one of \['ttft', 'tpot', 'e2el'\]"):
        parse_goodput(["ttft:500", "itl:50"])
    with pytest.raises(ValueError, match=r"goodput='ttft:fast'"):
        parse_goodput(["ttft:fast"])
    assert parse_goodput(["ttft:500", "e2el:4000"]).e2e == 4.0
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"prompt": "fine"}\n\n{"prompt": "also fine", "max_tokens": 4}\n{"prompt": "x", "max_tokens": 0}\n')
    with pytest.raises(ValueError, match=rf"prompts='{bad}' line 4: max_tokens=0; must be a JSON object"):
        read_prompts(bad, 8)
    bad.write_text('{"messages": [{"role": "bot", "content": "x"}]}\n')
    with pytest.raises(ValueError, match=r"line 1: messages="):
        read_prompts(bad, 8)
    bad.write_text('not json\n')
    with pytest.raises(ValueError, match=r"line 1: not JSON"):
        read_prompts(bad, 8)
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ValueError, match=rf"url='{url}'; must be an OpenAI-compatible server that answers"):
        run_load(url, one)


# --- the options people expect, against batchlab's server -------------------------------------------------
def test_chat_prompt_files_warmup_and_vllms_goodput(server, lm, tmp_path):
    from batchlab.loadgen import read_prompts, with_arrivals
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "Write a haiku about rain."}\n'
                    '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}],'
                    ' "max_tokens": 3}\n')
    prompts = read_prompts(path, 4, lm.tokenizer)
    assert [p.max_tokens for p in prompts] == [4, 3]
    assert prompts[1].prompt_len == len(lm.tokenizer.apply_chat_template(
        prompts[1].messages, add_generation_prompt=True, tokenize=True)["input_ids"])
    reqs = with_arrivals(prompts, 6, "poisson", rate=20.0, seed=1)
    result = run_load(server.url, reqs, endpoint="chat", warmup=2, target_rate=20.0, max_duration=120)
    assert result.status_counts() == {"ok": 6} and len(result.warmup) == 2 and all(r.ok for r in result.warmup)
    assert [r.num_tokens for r in result.records] == [4, 3] * 3
    assert "warm-up: 2 requests first (2 ok), not counted" in result.summary()
    assert {r.request_id for r in result.trace.requests} == {r.request_id for r in reqs}   # warm-ups left out
    tp = metrics.throughput(result.trace)
    assert result.goodput({"ttft": 60.0, "tpot": 60.0}) == pytest.approx(tp["request_throughput"])
    assert result.goodput({"ttft": 1e-6}) == 0.0


def test_max_concurrency_caps_requests_in_flight_on_top_of_a_rate(server, lm):
    reqs = plan_requests(8, prompt_len=16, output_len=4, tokenizer=lm.tokenizer, arrival="poisson", rate=50.0, seed=2)
    result = run_load(server.url, reqs, max_concurrency=2, target_rate=50.0, max_duration=120)
    assert result.status_counts() == {"ok": 8}
    events = sorted([(r.send_time, 1) for r in result.records] + [(r.end_time, -1) for r in result.records])
    assert max(np.cumsum([e for _, e in events])) == 2          # never more than 2 in flight
    assert sum(r.send_time > r.scheduled_time + 0.05 for r in result.records) >= 3   # later ones waited
    assert "at most 2 in flight" in result.summary()


def test_errors_mid_run_are_counted_by_status_never_dropped(lm):
    """One slot and room for one waiting request: a burst gets 429s; then the server is stopped
    while a load is running. Every request ends in its record, counted by outcome."""
    from batchlab.serve import ServerConfig, ServerThread
    reqs = plan_requests(8, prompt_len=16, output_len=6, tokenizer=lm.tokenizer, arrival="at_once", seed=4)
    with ServerThread(ServerConfig(max_num_seqs=1, max_model_len=128, max_waiting=1), lm) as s:
        burst = run_load(s.url, reqs, max_duration=120)
        counts = burst.status_counts()
        assert counts["ok"] >= 1 and counts["HTTP 429"] >= 1 and sum(counts.values()) == 8
        assert "HTTP 429" in burst.summary()
        long = plan_requests(4, prompt_len=16, output_len=100, tokenizer=lm.tokenizer, arrival="poisson", rate=4.0, seed=5)
        timer = threading.Timer(1.5, s.stop)
        timer.start()
        cut = run_load(s.url, long, max_duration=120, request_timeout=30)
        timer.join()
    outcomes = cut.status_counts()
    assert sum(outcomes.values()) == 4 and "ok" not in outcomes, outcomes
    assert all(r.end_time is not None and (r.error or r.finish_reason == "abort") for r in cut.records)


def test_the_command_line_sweeps_rates_and_writes_its_results(server, tmp_path, capsys):
    from batchlab.loadgen.__main__ import main
    code = main(["--url", server.url, "--rates", "2,8", "--num-requests", "4", "--prompt-len", "16",
                 "--output-len", "4", "--goodput", "ttft:60000", "--out", str(tmp_path), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0 and "--- rate 2/s" in out and "--- rate 8/s" in out
    assert "DistServe's goodput" in out and "above the sweep" in out          # every rate met a 60 s TTFT
    sweep = pd.read_csv(tmp_path / "sweep.csv")
    assert list(sweep["rate"]) == [2, 8] and list(sweep["slo_attainment"]) == [1.0, 1.0]
    for rate in ("2", "8"):
        summary = json.loads((tmp_path / f"rate_{rate}" / "summary.json").read_text())
        assert summary["outcomes"] == {"ok": 4} and summary["goodput"] > 0 and summary["latency_s"]["ttft"]["count"] == 4
        rows = pd.read_csv(tmp_path / f"rate_{rate}" / "requests.csv")
        assert len(rows) == 4 and set(rows["outcome"]) == {"ok"}
    assert main(["--url", server.url, "--rates", "2,-1"]) == 2
    assert "rates='2,-1'; must be" in capsys.readouterr().err


def test_a_load_cut_at_max_duration_says_so(server, lm):
    reqs = plan_requests(4, prompt_len=16, output_len=100, tokenizer=lm.tokenizer, arrival="poisson", rate=2.0, seed=6)
    with pytest.warns(UserWarning, match="CUT: the load reached max_duration=1.0 s"):
        result = run_load(server.url, reqs, target_rate=2.0, max_duration=1.0)
    assert result.cut and "CUT:" in result.summary()
    assert sum(result.status_counts().values()) == 4 and "ok" not in result.status_counts()
    assert all(r.error and r.error.startswith(("cancelled", "not sent")) for r in result.records)
