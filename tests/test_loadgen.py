"""The load client: its metrics on chunk timestamps computed by hand, and a short real load on
batchlab's server (open and closed loop)."""

from __future__ import annotations

import http.server
import json
import math
import threading
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from batchlab.engine_args import EngineArgs
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
    with ServerThread(ServerConfig(engine=EngineArgs(max_num_seqs=8, max_model_len=128)), lm) as s:
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
    # One server, one clock offset: a step that gave two requests a token is one instant in both.
    assert len({r.server["engine_clock_unix_offset"] for r in result.records}) == 1
    closed = run_load(server.url, reqs, mode="closed", concurrency=2, max_duration=120)
    assert all(r.ok for r in closed.records)
    starts = sorted(r.send_time for r in closed.records)
    ends = sorted(r.end_time for r in closed.records)
    # Never more than 2 in flight: the third request is sent only after the first one ended.
    assert starts[2] >= ends[0] - 1e-6
    # Fewer users than slots: a request waits for the step in progress at most, never a slot.
    assert metrics.steps_waited(closed.server_trace()).max() <= 1
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
    with ServerThread(ServerConfig(engine=EngineArgs(max_num_seqs=1, max_model_len=128), max_waiting=1), lm) as s:
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
    from batchlab.loadgen.vllm_result import read_result
    code = main(["--base-url", server.url, "--rates", "2,8", "--num-prompts", "4", "--input-len", "16",
                 "--output-len", "4", "--goodput", "ttft:60000", "--save-result", "--result-dir", str(tmp_path),
                 "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,99.9", "--disable-tqdm"])
    out = capsys.readouterr().out
    assert code == 0 and "--- rate 2/s" in out and "--- rate 8/s" in out
    assert "DistServe's goodput" in out and "above the sweep" in out          # every rate met a 60 s TTFT
    assert "Median TTFT (ms):" in out and "P99.9 E2EL (ms):" in out and "TPOT" not in out
    sweep = pd.read_csv(tmp_path / "sweep.csv")
    assert list(sweep["rate"]) == [2, 8] and list(sweep["slo_attainment"]) == [1.0, 1.0]
    for rate in ("2.0", "8.0"):                     # vLLM's file names: {label}-{rate}qps-{model}-{date}.json
        [path] = tmp_path.glob(f"openai-{rate}qps-*.json")
        result = read_result(path)
        assert result.completed == 4 and result.failed == 0 and result.raw["request_goodput"] > 0
        assert result.request_rate == float(rate) and result.total_output_tokens == 16
        assert list(result.latency_ms.index) == ["ttft", "e2el"]
        assert set(result.latency_ms.columns) == {"mean", "median", "std", "p50", "p99.9"}
        rows = pd.read_csv(path.with_suffix(".requests.csv"))
        assert len(rows) == 4 and set(rows["outcome"]) == {"ok"}
    assert main(["--url", server.url, "--rates", "2,-1"]) == 2           # the old names still work
    assert "rates='2,-1'; must be" in capsys.readouterr().err


def test_a_load_cut_at_max_duration_says_so(server, lm):
    reqs = plan_requests(4, prompt_len=16, output_len=100, tokenizer=lm.tokenizer, arrival="poisson", rate=2.0, seed=6)
    with pytest.warns(UserWarning, match="CUT: the load reached max_duration=1.0 s"):
        result = run_load(server.url, reqs, target_rate=2.0, max_duration=1.0)
    assert result.cut and "CUT:" in result.summary()
    assert sum(result.status_counts().values()) == 4 and "ok" not in result.status_counts()
    assert all(r.error and r.error.startswith(("cancelled", "not sent")) for r in result.records)


# --- vllm bench serve's options: arrivals, datasets, what is sent, bad flags ----------------------------
def test_arrivals_are_scaled_as_vllm_scales_them():
    from batchlab.loadgen.schedule import Schedule
    for seed in range(3):                  # the last send lands at N / rate, whatever the draw
        times = Schedule(2.0).send_times(16, seed)
        assert times[-1] == pytest.approx(8.0) and np.all(np.diff(times) >= 0) and times[0] > 0
    assert Schedule(2.0, burstiness=math.inf).send_times(4).tolist() == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert Schedule().send_times(3).tolist() == [0.0, 0.0, 0.0]                    # rate inf: all at once
    bursty = np.diff(Schedule(5.0, burstiness=0.25).send_times(200, 1))
    assert bursty.std() / bursty.mean() > 1.3                                      # gamma shape 0.25: CV 2
    linear = Schedule(ramp_up_strategy="linear", ramp_up_start_rps=1, ramp_up_end_rps=8)
    assert [linear.rate_at(i, 8) for i in (0, 7)] == [1.0, 8.0]
    exp = Schedule(ramp_up_strategy="exponential", ramp_up_start_rps=1, ramp_up_end_rps=16)
    assert exp.rate_at(2, 5) == pytest.approx(4.0)                                # 1 * 16 ** (2/4)
    gaps = np.diff(linear.send_times(400, 0))
    assert gaps[:100].mean() > 2.5 * gaps[-100:].mean()                           # faster as it ramps
    assert Schedule(2.0).label == "2.0qps" and linear.label == "ramp-up-linear-1qps-8qps"


def test_vllms_datasets(lm, tmp_path):
    from batchlab.loadgen.datasets import DatasetConfig
    tok = lm.tokenizer
    rand = DatasetConfig(random_input_len=20, random_output_len=10, random_range_ratio='{"input": 0.5, "output": 0}',
                         random_prefix_len=4).sample(40, tok, seed=3)
    assert all(14 <= r.prompt_len <= 34 and r.max_tokens == 10 and len(r.prompt) == r.prompt_len for r in rand)
    assert len({tuple(r.prompt[:4]) for r in rand}) == 1 and len({tuple(r.prompt) for r in rand}) == 40
    assert not set(tok.all_special_ids) & {t for r in rand for t in r.prompt}
    assert [r.prompt for r in DatasetConfig().sample(3, tok, 3)] == [r.prompt for r in DatasetConfig().sample(3, tok, 3)]
    rep = DatasetConfig("prefix_repetition", prefix_repetition_prefix_len=8, prefix_repetition_suffix_len=4,
                        prefix_repetition_num_prefixes=3, prefix_repetition_output_len=5).sample(10, tok)
    assert len(rep) == 9 and all(len(r.prompt) == 12 and r.max_tokens == 5 for r in rep)   # 10 // 3 per prefix
    assert sorted(Counter(tuple(r.prompt[:8]) for r in rep).values()) == [3, 3, 3]
    path = tmp_path / "sharegpt.json"
    conv = lambda q, a: {"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}
    path.write_text(json.dumps([conv("Tell me a story about a dragon and a knight.", "Once upon a time there lived a dragon."),
                                conv("Hi", "Hello there, how are you today?"),          # prompt under 4 tokens: left out
                                {"conversations": [{"from": "human", "value": "alone"}]},  # one turn: left out
                                conv("What is the capital city of France, please?", "Paris is the capital.")]))
    share = DatasetConfig("sharegpt", str(path)).sample(5, tok, seed=0)
    assert len(share) == 5 and {r.prompt for r in share} == {"Tell me a story about a dragon and a knight.",
                                                            "What is the capital city of France, please?"}
    assert share[0].max_tokens == len(tok(next(c["conversations"][1]["value"] for c in json.loads(path.read_text())
                                               if c["conversations"][0]["value"] == share[0].prompt))["input_ids"])
    assert len(DatasetConfig("sharegpt", str(path), no_oversample=True, sharegpt_output_len=7).sample(5, tok)) == 2


def test_ignore_eos_and_continuous_usage_stats_only_when_asked():
    from batchlab.loadgen.__main__ import ignore_eos_for, parse_args
    from batchlab.loadgen.client import _body
    lr = LoadRequest("a", "hi", 3)
    plain = _body(lr, "completions", "m", {"temperature": 0.0}, continuous_usage_stats=False)
    assert plain["stream_options"] == {"include_usage": True} and "ignore_eos" not in plain
    assert _body(lr, "completions", "m", {})["stream_options"]["continuous_usage_stats"] is True
    eos = {" ".join(a): ignore_eos_for(parse_args(["--base-url", "x"] + a)) for a in (
        [], ["--dataset-name", "sharegpt"], ["--dataset-name", "sharegpt", "--ignore-eos"], ["--no-ignore-eos"],
        ["--prompts", "p.jsonl"], ["--workload", "w.jsonl"])}
    assert eos == {"": True, "--dataset-name sharegpt": False, "--dataset-name sharegpt --ignore-eos": True,
                   "--no-ignore-eos": False, "--prompts p.jsonl": False, "--workload w.jsonl": True}


@pytest.mark.parametrize("flags, message", [
    (["--dataset-name", "burstgpt"], "dataset-name='burstgpt'; must be one of ['random', 'sharegpt', 'prefix_repetition']"),
    (["--dataset-name", "sharegpt", "--dataset-path", "no/such.json"], "dataset-path='no/such.json'; must be a ShareGPT-style JSON file (no such file)"),
    (["--dataset-name", "sharegpt"], "dataset-path=None; must be a ShareGPT-style JSON file"),
    (["--dataset-path", "x.json"], "dataset-path='x.json'; must be unset with --dataset-name random"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1"], "ramp-up-end-rps=None; must be a positive number"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "4", "--request-rate", "2"],
     "request-rate=2.0; must be unset (inf) with --ramp-up-strategy"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "8", "--ramp-up-end-rps", "4"], "ramp-up-start-rps=8.0; must be <= ramp-up-end-rps=4.0"),
    (["--ramp-up-strategy", "cubic", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "4"], "ramp-up-strategy='cubic'; must be one of ['linear', 'exponential']"),
    (["--ramp-up-start-rps", "1"], "ramp-up-start-rps=1.0; must be unset without --ramp-up-strategy"),
    (["--header", "x-team"], "header='x-team'; must be KEY=VALUE"),
    (["--extra-body", "{top_k: 5}"], "extra-body='{top_k: 5}'; must be a JSON object"),
    (["--extra-body", "[1, 2]"], "extra-body='[1, 2]'; must be a JSON object"),
    (["--percentile-metrics", "ttft,latency"], "percentile-metrics='ttft,latency'; must be distinct comma-separated names"),
    (["--metric-percentiles", "50,101"], "metric-percentiles='50,101'; must be comma-separated percentiles in (0, 100]"),
    (["--random-range-ratio", "1.5"], "random-range-ratio='1.5'; must be in [0, 1)"),
    (["--request-rate", "0"], "request-rate=0.0; must be a positive number"),
    (["--result-dir", "runs"], "save-result=False; must be given with --result-dir"),
])
def test_bad_command_line_options_stop_with_one_line_and_exit_code_2(flags, message, capsys):
    from batchlab.loadgen.__main__ import main
    assert main(["--base-url", "http://127.0.0.1:9"] + flags) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("batchlab.loadgen: ") and message in err, err


class StrictServer(http.server.BaseHTTPRequestHandler):
    """An OpenAI-style server that refuses fields it does not know (as OpenAI's own does) and
    streams one text chunk per token but the last (whose token only the final usage counts)."""

    KNOWN = {"model", "prompt", "max_tokens", "stream", "stream_options", "temperature", "top_k"}
    seen: list = []

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(200, json.dumps({"data": [{"id": "strict-model"}]}).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((dict(self.headers), body))
        unknown = set(body) - self.KNOWN | set(body.get("stream_options", {})) - {"include_usage"}
        if unknown:
            return self._send(400, json.dumps({"error": {"message": f"unknown fields {sorted(unknown)}"}}).encode())
        n = body["max_tokens"]
        chunks = [{"choices": [{"index": 0, "text": "ab"[i % 2] if i < n - 1 else "",
                                "finish_reason": "length" if i == n - 1 else None}]} for i in range(n)]
        chunks.append({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n}})
        self._send(200, b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n",
                   "text/event-stream")


def test_a_strict_server_gets_only_what_was_asked_for(tmp_path):
    """vLLM's flags against a server that refuses ignore_eos and continuous_usage_stats: --header
    and --extra-body arrive, tokens are counted from the final usage, ramp-ups are named as vLLM names them."""
    from batchlab.loadgen.__main__ import main
    from batchlab.loadgen.vllm_result import read_result
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": "Name three rivers of Europe, please."},
                                                   {"from": "gpt", "value": "The Danube, the Rhine and the Loire."}]}]))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StrictServer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        common = ["--base-url", url, "--dataset-name", "sharegpt", "--dataset-path", str(path), "--output-len", "3",
                  "--header", "x-team=course", "--extra-body", '{"top_k": 5}', "--disable-tqdm", "--save-result",
                  "--result-dir", str(tmp_path / "runs"), "--percentile-metrics", "ttft,itl,e2el"]
        assert main(common + ["--num-prompts", "3", "--request-rate", "50", "--result-filename", "steady.json",
                              "--save-detailed"]) == 0
        headers, body = StrictServer.seen[-1]
        assert headers["x-team"] == "course" and body["top_k"] == 5 and body["stream_options"] == {"include_usage": True}
        steady = read_result(tmp_path / "runs" / "steady.json")
        assert steady.completed == 3 and steady.total_output_tokens == 9 and steady.total_input_tokens == 21
        assert steady.request_rate == 50 and steady.raw["model_id"] == "strict-model"
        detail = steady.raw                        # --save-detailed: per-request lists, in seconds
        assert detail["output_lens"] == [3, 3, 3] and detail["input_lens"] == [7, 7, 7]
        assert len(detail["ttfts"]) == 3 and all(0 < t < steady.duration_s for t in detail["ttfts"])
        assert [len(gaps) for gaps in detail["itls"]] == [2, 2, 2] and detail["errors"] == ["", "", ""]
        assert detail["median_ttft_ms"] == pytest.approx(1e3 * float(np.median(detail["ttfts"])))
        assert main(common + ["--num-prompts", "4", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "20",
                              "--ramp-up-end-rps", "40"]) == 0
        [ramp] = (tmp_path / "runs").glob("openai-ramp-up-linear-20qps-40qps-strict-model-*.json")
        raw = read_result(ramp).raw
        assert (raw["ramp_up_strategy"], raw["ramp_up_start_rps"], raw["ramp_up_end_rps"]) == ("linear", 20, 40)
        assert main(common + ["--num-prompts", "1", "--ignore-eos"]) == 1       # asked for: this server refuses it
    finally:
        httpd.shutdown()
