"""batchlab's OpenAI-compatible server on 127.0.0.1, with the real model.

Bounded: every request asks for a few tokens, every wait has a timeout, and the servers stop at
the end of the module. No timing is asserted.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import numpy as np
import pytest

import batchlab
from batchlab.engine_args import EngineArgs
from batchlab.backends import ModelBackend
from batchlab.engine import Engine
from batchlab.requests import Request
from batchlab.schedulers import ContinuousBatcher
from batchlab.serve import ServerConfig, ServerThread
from batchlab.launch import start_server

TIMEOUT = httpx.Timeout(120.0)
WORDS = ["river", "mountain", "garden", "engine", "violin", "market", "winter", "planet"]


def prompts(n: int) -> list[str]:
    return [f"Tell me about the {WORDS[i % 8]} number {i}:" for i in range(n)]


@pytest.fixture(scope="module")
def server(lm):
    config = ServerConfig(policy="continuous",
                          engine=EngineArgs(max_num_seqs=64, max_model_len=128, max_num_batched_tokens=512))
    with ServerThread(config, lm) as s:
        yield s


def stats(url: str) -> dict:
    return httpx.get(f"{url}/batchlab/stats", timeout=10).json()


def wait_until_idle(url: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        s = stats(url)
        if s["in_flight"] == 0 and s["kv_used_tokens"] == 0:
            return s
        assert time.monotonic() < deadline, f"the server did not become idle: {s}"
        time.sleep(0.1)


async def stream_completion(client: httpx.AsyncClient, body: dict, stop_after: int | None = None) -> dict:
    """POST a streaming completion; collect the text, chunks and the final extension field.
    ``stop_after``: close the connection after that many chunks (a client going away)."""
    out = {"text": "", "chunks": 0, "finish_reason": None, "batchlab": None, "usage": None, "status": None}
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        out["status"] = r.status_code
        if r.status_code != 200:
            out["error"] = json.loads(await r.aread())
            return out
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                out["usage"] = chunk["usage"]
            for choice in chunk["choices"]:
                out["text"] += choice["text"]
                out["chunks"] += 1
                out["finish_reason"] = choice["finish_reason"] or out["finish_reason"]
            out["batchlab"] = chunk.get("batchlab") or out["batchlab"]
            if stop_after is not None and out["chunks"] >= stop_after:
                return out          # leaving the block closes the connection mid-stream
    return out


def run(coro):
    return asyncio.run(coro)


def test_64_concurrent_streams_equal_the_offline_engine(server, lm):
    texts = prompts(64)
    lengths = [2 + i % 4 for i in range(64)]            # 2..5 tokens each
    tok = lm.tokenizer
    reqs = [Request(f"r{i}", tok(t)["input_ids"], n) for i, (t, n) in enumerate(zip(texts, lengths))]
    offline = Engine(ContinuousBatcher(max_num_seqs=64), ModelBackend(lm, num_slots=64, max_seq_len=128)).run(reqs)
    expected = {r.request_id: r.output_ids for r in offline.requests}

    async def go():
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT, limits=limits) as client:
            return await asyncio.gather(*[
                stream_completion(client, {"prompt": t, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                                           "stream_options": {"include_usage": True}})
                for t, n in zip(texts, lengths)])

    results = run(go())
    for i, res in enumerate(results):
        assert res["status"] == 200 and res["finish_reason"] == "length"
        assert res["usage"]["completion_tokens"] == lengths[i]
        assert res["batchlab"]["token_ids"] == expected[f"r{i}"], f"request {i}: streamed tokens differ"
        assert res["text"] == tok.decode(expected[f"r{i}"], skip_special_tokens=True)
    wait_until_idle(server.url)


def test_20_mid_stream_disconnects_free_the_kv_cache(server):
    async def go():
        async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT) as client:
            return await asyncio.gather(*[
                stream_completion(client, {"prompt": p, "max_tokens": 100, "temperature": 0, "ignore_eos": True},
                                  stop_after=2)
                for p in prompts(20)])

    results = run(go())
    assert all(r["status"] == 200 and r["chunks"] == 2 and r["finish_reason"] is None for r in results)
    s = wait_until_idle(server.url)        # every request aborted, every slot back
    assert s["kv_used_tokens"] == 0 and server.runner.scheduler.running == []
    assert httpx.get(f"{server.url}/health").status_code == 200


BAD = [
    ("malformed JSON", "/v1/completions", b'{"prompt": "x",', 400, None),
    ("not an object", "/v1/completions", b'["x"]', 400, None),
    ("missing prompt", "/v1/completions", {"max_tokens": 4}, 400, "prompt"),
    ("prompt of the wrong type", "/v1/completions", {"prompt": 12}, 400, "prompt"),
    ("max_tokens 0", "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens negative", "/v1/completions", {"prompt": "x", "max_tokens": -3}, 400, "max_tokens"),
    ("max_tokens a string", "/v1/completions", {"prompt": "x", "max_tokens": "4"}, 400, "max_tokens"),
    ("prompt past the window", "/v1/completions", {"prompt": "word " * 200}, 400, "prompt"),
    ("output past the window", "/v1/completions", {"prompt": "x", "max_tokens": 500}, 400, "max_tokens"),
    ("unknown model", "/v1/completions", {"prompt": "x", "model": "gpt-9"}, 404, "model"),
    ("temperature out of range", "/v1/completions", {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("top_p 0", "/v1/completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("seed a float", "/v1/completions", {"prompt": "x", "seed": 1.5}, 400, "seed"),
    ("stream not a bool", "/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "stream"),
    ("stop of the wrong type", "/v1/completions", {"prompt": "x", "stop": 5}, 400, "stop"),
    ("n of 2", "/v1/completions", {"prompt": "x", "n": 2}, 400, "n"),
    ("missing messages", "/v1/chat/completions", {"max_tokens": 4}, 400, "messages"),
    ("unknown role", "/v1/chat/completions", {"messages": [{"role": "bot", "content": "hi"}]}, 400,
     "messages[0].role"),
    ("content not text", "/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, 400,
     "messages[0].content"),
]


@pytest.mark.parametrize("what,path,body,status,param", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_its_4xx_naming_the_field(server, what, path, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{server.url}{path}", content=content, headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == status and error["message"]
    if param is not None:
        assert param.split(".")[-1].split("[")[0] in error["message"]
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_chat_stop_strings_sampling_and_whole_responses(server, lm):
    client = httpx.Client(base_url=server.url, timeout=TIMEOUT)
    chat = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 12, "temperature": 0}).json()
    expected_ids = lm.chat_ids("What is the capital of France?")
    assert chat["usage"]["prompt_tokens"] == len(expected_ids)      # the tokenizer's chat template
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["content"]
    whole = client.post("/v1/completions", json={"prompt": "One, two, three,", "max_tokens": 8,
                                                 "temperature": 0, "ignore_eos": True}).json()
    text = whole["choices"][0]["text"]
    cut = text.strip().split(" ")[1]                                # a word in the middle of it
    stopped = client.post("/v1/completions", json={"prompt": "One, two, three,", "max_tokens": 8,
                                                   "temperature": 0, "ignore_eos": True, "stop": cut}).json()
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["choices"][0]["text"] == text[:text.index(cut)]
    seeded = [client.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 8,
                                                   "temperature": 1.0, "top_p": 0.9, "seed": 7}).json()
              for _ in range(2)]
    assert seeded[0]["choices"][0]["text"] == seeded[1]["choices"][0]["text"]   # seed: reproducible
    t = whole["batchlab"]
    assert t["arrival_time"] <= t["first_scheduled_time"] <= t["first_token_time"] <= t["finish_time"]
    assert t["ttft_s"] == pytest.approx(t["first_token_time"] - t["arrival_time"])
    assert client.get("/v1/models").json()["data"][0]["id"] == "SmolLM2-135M-Instruct"
    wait_until_idle(server.url)


def test_overload_burst_gets_429s_and_every_accepted_request_finishes(lm):
    config = ServerConfig(policy="continuous", engine=EngineArgs(max_num_seqs=2, max_model_len=128), max_waiting=2)
    with ServerThread(config, lm, api_key="sekrit") as s:
        assert httpx.post(f"{s.url}/v1/completions", json={"prompt": "x"}).status_code == 401
        assert httpx.get(f"{s.url}/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        headers = {"Authorization": "Bearer sekrit"}

        async def go():
            async with httpx.AsyncClient(base_url=s.url, timeout=TIMEOUT, headers=headers) as client:
                return await asyncio.gather(*[
                    stream_completion(client, {"prompt": p, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                                               "stream_options": {"include_usage": True}})
                    for p in prompts(16)])

        results = run(go())
        codes = [r["status"] for r in results]
        assert set(codes) <= {200, 429} and codes.count(429) >= 1 and codes.count(200) >= 2
        for r in results:
            if r["status"] == 200:
                assert r["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 6
            else:
                assert r["error"]["error"]["type"] == "rate_limit_exceeded"
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": "x"}, headers=headers)
        assert r.status_code == 200
        assert stats(s.url)["refused_429"] == codes.count(429)


def test_429_carries_retry_after_when_the_queue_is_full(lm):
    """Static batches of 2 and room for 2 waiting: while a batch runs, two more wait; a fifth is refused."""
    config = ServerConfig(policy="static", engine=EngineArgs(max_num_seqs=2, max_model_len=128), batch_size=2,
                          max_waiting=2)
    with ServerThread(config, lm) as s:
        async def go():
            async with httpx.AsyncClient(base_url=s.url, timeout=TIMEOUT) as client:
                def send(p, n):
                    return asyncio.ensure_future(client.post("/v1/completions", json={
                        "prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": True}))
                running = [send("a", 60), send("b", 60)]
                while stats(s.url)["waiting"] or stats(s.url)["in_flight"] < 2:
                    await asyncio.sleep(0.02)    # the first batch is running
                waiting = [send("c", 2), send("d", 2)]
                while stats(s.url)["waiting"] < 2:
                    await asyncio.sleep(0.02)
                refused = await client.post("/v1/completions", json={"prompt": "e", "max_tokens": 2})
                return refused, await asyncio.gather(*running, *waiting)
        refused, served = run(go())
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert "max-waiting" in refused.json()["error"]["message"]
        assert [r.status_code for r in served] == [200] * 4


def test_sigterm_ends_streams_with_a_stated_reason():
    server = start_server(policy="continuous", max_num_seqs=4, max_model_len=256, threads=1)
    try:
        async def go():
            async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT) as client:
                task = asyncio.ensure_future(stream_completion(
                    client, {"prompt": "Count:", "max_tokens": 200, "temperature": 0, "ignore_eos": True}))
                while stats(server.url)["in_flight"] == 0:
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.5)
                server.proc.send_signal(15)
                return await task
        res = run(go())
    finally:
        code = server.stop()
    assert res["finish_reason"] == "abort"
    assert res["batchlab"]["status"] == "aborted"
    assert res["batchlab"]["finish_detail"] == "server shutting down (SIGTERM)"
    assert 0 < len(res["batchlab"]["token_ids"]) < 200
    # uvicorn re-raises the signal it handled once it has shut down cleanly, so the exit is "by SIGTERM".
    assert code in (0, -15) and "Traceback" not in server.log()


# --- the protocols other tools speak -------------------------------------------------------------------
BAD_FIELDS = [
    ("more logprobs than vLLM's maximum", {"prompt": "x", "logprobs": 21}, "logprobs"),
    ("echo with logprobs", {"prompt": "x", "logprobs": 1, "echo": True}, "echo"),
    ("prompt logprobs", {"prompt": "x", "prompt_logprobs": 1}, "prompt_logprobs"),
    ("top_k below -1", {"prompt": "x", "top_k": -2}, "top_k"),
    ("min_p past 1", {"prompt": "x", "min_p": 1.5}, "min_p"),
    ("a penalty past 2", {"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ("repetition_penalty 0", {"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ("min_tokens past max_tokens", {"prompt": "x", "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ("logit_bias on no token", {"prompt": "x", "logit_bias": {"-3": 1}}, "logit_bias"),
    ("two choices", {"prompt": "x", "n": 2}, "n"),
    ("beam search", {"prompt": "x", "use_beam_search": True}, "use_beam_search"),
    ("JSON output", {"prompt": "x", "response_format": {"type": "json_object"}}, "response_format"),
    ("stop_token_ids of the wrong type", {"prompt": "x", "stop_token_ids": ["a"]}, "stop_token_ids"),
    ("unknown stream option", {"prompt": "x", "stream_options": {"include_usage": True, "x": 1}},
     "stream_options.x"),
]


@pytest.mark.parametrize("what,body,param", BAD_FIELDS, ids=[b[0] for b in BAD_FIELDS])
def test_unimplemented_fields_get_a_400_naming_them(server, what, body, param):
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and param.split(".")[-1] in error["message"]


def test_do_nothing_values_and_implemented_fields_are_served(server, lm):
    """What benchmark clients send by default passes; stop_token_ids, echo and
    include_stop_str_in_output do what they say."""
    client = httpx.Client(base_url=server.url, timeout=TIMEOUT)
    base = {"prompt": "One, two, three,", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    plain = client.post("/v1/completions", json={**base, "logprobs": None, "repetition_penalty": 1.0,
                                                 "top_k": -1, "presence_penalty": 0}).json()
    ids = plain["batchlab"]["token_ids"]
    text = plain["choices"][0]["text"]
    stopped = client.post("/v1/completions", json={**base, "stop_token_ids": [ids[2]]}).json()
    assert stopped["choices"][0]["finish_reason"] == "stop" and stopped["usage"]["completion_tokens"] == 3
    assert stopped["choices"][0]["text"] == lm.decode(ids[:2])            # the stop token is not shown
    echoed = client.post("/v1/completions", json={**base, "echo": True}).json()
    assert echoed["choices"][0]["text"] == base["prompt"] + text
    cut = text.strip().split(" ")[1]
    kept = client.post("/v1/completions", json={**base, "stop": cut, "include_stop_str_in_output": True}).json()
    assert kept["choices"][0]["text"] == text[:text.index(cut) + len(cut)]
    assert kept["choices"][0]["finish_reason"] == "stop"


def test_vllms_sampling_fields_are_served_and_unknown_fields_ignored_with_a_log_line(server, lm, caplog):
    client = httpx.Client(base_url=server.url, timeout=TIMEOUT)
    base = {"prompt": "Answer yes or no: is water wet?", "max_tokens": 14, "temperature": 0}
    plain = client.post("/v1/completions", json=base).json()["choices"][0]
    assert plain["finish_reason"] == "stop"                 # the model's end-of-sequence, early
    with caplog.at_level("WARNING", logger="batchlab.serve"):
        longer = client.post("/v1/completions", json={**base, "min_tokens": 12, "frobnicate": 1}).json()
    assert longer["usage"]["completion_tokens"] >= 12
    assert any("ignored: ['frobnicate']" in r.getMessage() for r in caplog.records)
    for extra in ({"top_k": 5, "min_p": 0.1, "temperature": 0.8, "seed": 1},
                  {"repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.5},
                  {"logit_bias": {str(lm.tokenizer.eos_token_id): -100}}):
        r = client.post("/v1/completions", json={**base, **extra})
        assert r.status_code == 200, (extra, r.text)
    with caplog.at_level("WARNING", logger="batchlab.serve"):
        client.post("/v1/completions", json={**base, "top_k": -7})
    assert any("refused 400: top_k=-7" in r.getMessage() for r in caplog.records)   # every refusal is logged


def test_logprobs_in_vllms_shapes_streamed_or_whole(server, lm):
    client = httpx.Client(base_url=server.url, timeout=TIMEOUT)
    body = {"prompt": "The capital of France is", "max_tokens": 5, "temperature": 0, "logprobs": 3, "ignore_eos": True}
    whole = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    assert len(whole["tokens"]) == 5 and "".join(whole["tokens"]) == client.post(
        "/v1/completions", json=body).json()["choices"][0]["text"]
    assert all(v <= 0 for v in whole["token_logprobs"]) and whole["text_offset"][0] == 0
    for token, value, top in zip(whole["tokens"], whole["token_logprobs"], whole["top_logprobs"]):
        assert len(top) == 3 and top[token] == value == max(top.values())     # greedy: the most likely
    pieces = []
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                pieces += [c["logprobs"] for c in json.loads(line[6:])["choices"] if c["logprobs"]]
    assert sum((p["tokens"] for p in pieces), []) == whole["tokens"]
    assert sum((p["text_offset"] for p in pieces), []) == whole["text_offset"]
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                                                      "temperature": 0, "logprobs": True, "top_logprobs": 2}).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == chat["usage"]["completion_tokens"]
    assert all(len(c["top_logprobs"]) == 2 and c["top_logprobs"][0]["token"] == c["token"] for c in content)
    assert all(bytes(c["bytes"]).decode() == c["token"] for c in content)


def test_vllms_small_routes_and_its_context_length_wording(server):
    client = httpx.Client(base_url=server.url, timeout=TIMEOUT)
    assert client.get("/ping").status_code == 200 and client.post("/ping").status_code == 200
    assert client.get("/version").json()["version"] == batchlab.__version__
    assert client.get("/load").json() == {"server_load": 0}
    permission = client.get("/v1/models").json()["data"][0]["permission"][0]
    assert permission["object"] == "model_permission" and permission["allow_sampling"] is True
    for body in ({"prompt": "word " * 2000}, {"prompt": "x", "max_tokens": 5000}):   # what clients match on
        message = client.post("/v1/completions", json=body).json()["error"]["message"]
        assert message.startswith("This model's maximum context length is "), message


def test_models_request_ids_and_tokenize_speak_vllms_protocol(server, lm):
    client = httpx.Client(base_url=server.url, timeout=TIMEOUT)
    model = client.get("/v1/models").json()["data"][0]
    assert model["root"] == lm.tokenizer.name_or_path and model["parent"] is None
    body = {"prompt": "Hello", "max_tokens": 3, "temperature": 0}
    whole = client.post("/v1/completions", json=body, headers={"X-Request-Id": "bench-7"})
    assert whole.headers["x-request-id"] == "bench-7" and whole.json()["id"] == "cmpl-bench-7"
    assert whole.json()["batchlab"]["x_request_id"] == "bench-7"
    assert whole.json()["batchlab"]["request_id"] != "cmpl-bench-7"      # the engine's own id stays unique
    again = client.post("/v1/completions", json=body, headers={"X-Request-Id": "bench-7"})   # reused: fine
    assert again.status_code == 200 and again.headers["x-request-id"] == "bench-7"
    res = run(_stream_with_header(server.url, {**body, "stream": True}, "bench-8"))
    assert res["header"] == "bench-8" and res["id"] == "cmpl-bench-8" and res["batchlab"]["x_request_id"] == "bench-8"
    tokens = client.post("/tokenize", json={"model": model["root"], "prompt": "Hello world",
                                            "add_special_tokens": False, "return_token_strs": True}).json()
    assert tokens["tokens"] == lm.tokenizer("Hello world", add_special_tokens=False)["input_ids"]
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 128
    assert "".join(tokens["token_strs"]).replace("Ġ", " ") == "Hello world"
    chat = client.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat["tokens"] == lm.chat_ids("Hi")
    assert client.post("/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": "Hello world"}
    for path, bad, param in (("/tokenize", {"prompt": 3}, "prompt"), ("/detokenize", {"tokens": [-1]}, "tokens"),
                             ("/tokenize", {"prompt": "x", "model": "gpt-9"}, "model")):
        r = client.post(path, json=bad)
        assert r.status_code in (400, 404) and r.json()["error"]["param"] == param


async def _stream_with_header(url: str, body: dict, request_id: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        async with client.stream("POST", "/v1/completions", json=body, headers={"X-Request-Id": request_id}) as r:
            out = {"header": r.headers.get("x-request-id")}
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    out["id"] = chunk["id"]
                    out["batchlab"] = chunk.get("batchlab") or out.get("batchlab")
    return out


def test_the_finish_reason_rides_on_the_last_tokens_chunk(server):
    res = run(_chunks(server.url, {"prompt": "Count:", "max_tokens": 5, "temperature": 0, "ignore_eos": True,
                                   "stream": True, "stream_options": {"continuous_usage_stats": True}}))
    assert [c["usage"]["completion_tokens"] for c in res] == [1, 2, 3, 4, 5]        # one chunk per token
    assert [c["choices"][0]["finish_reason"] for c in res] == [None] * 4 + ["length"]
    assert "batchlab" in res[-1]


async def _chunks(url: str, body: dict) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            return [json.loads(line[6:]) async for line in r.aiter_lines() if line.startswith("data: {")]


def test_health_answers_503_with_an_error_object_when_the_engine_stops(lm):
    with ServerThread(ServerConfig(engine=EngineArgs(max_num_seqs=2, max_model_len=64)), lm) as s:
        s.runner.shutdown("stopped by the test")
        s.runner.join()
        r = httpx.get(f"{s.url}/health", timeout=10)
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "service_unavailable" and r.json()["error"]["code"] == 503
        refused = httpx.post(f"{s.url}/v1/completions", json={"prompt": "x"}, timeout=10)
        assert refused.status_code == 503 and "stopped by the test" in refused.json()["error"]["message"]


# --- /metrics against the trace -----------------------------------------------------------------------
def test_metrics_scraped_during_a_load_agree_with_the_trace(lm):
    """Paged KV with prefix caching and a budget small enough to preempt: 12 streams sharing a
    32-token prefix, 2 of them leaving early. /metrics is scraped every 0.1 s during the load; at
    the end every counter and histogram equals what the engine's trace says."""
    from batchlab.analysis import metrics
    from batchlab.loadgen.prom import histogram_buckets, histogram_sum, parse_metrics, value
    cfg = lm.model.config
    bytes_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (
        cfg.hidden_size // cfg.num_attention_heads) * lm.model.dtype.itemsize
    config = ServerConfig(engine=EngineArgs(max_num_seqs=8, max_model_len=128, enable_prefix_caching=True), paged=True,
                          kv_cache_memory_bytes=14 * 16 * bytes_per_token)
    prefix = lm.tokenizer("The history of the river valley, its towns and its people, told from the " * 3,
                          add_special_tokens=False)["input_ids"][:32]
    texts = [prefix + lm.tokenizer(f" part {i}:", add_special_tokens=False)["input_ids"] for i in range(14)]
    scrapes: list = []
    with ServerThread(config, lm) as s:
        stop = threading.Event()

        def scraper() -> None:
            while not stop.is_set():
                scrapes.append(parse_metrics(httpx.get(f"{s.url}/metrics", timeout=10).text))
                time.sleep(0.1)

        watcher = threading.Thread(target=scraper)
        watcher.start()

        async def go():
            async with httpx.AsyncClient(base_url=s.url, timeout=TIMEOUT) as client:
                return await asyncio.gather(*[
                    stream_completion(client, {"prompt": ids, "max_tokens": 24, "temperature": 0, "ignore_eos": True},
                                      stop_after=2 if i >= 12 else None) for i, ids in enumerate(texts)])
        results = run(go())
        wait_until_idle(s.url)
        stop.set()
        watcher.join()
        final = parse_metrics(httpx.get(f"{s.url}/metrics", timeout=10).text)
        hit_tokens = s.runner.backend.kv.num_hit_tokens
    trace = s.runner.trace
    assert sum(r["finish_reason"] == "length" for r in results) == 12
    # During the load: requests ran and held KV; counters only grew.
    assert max(value(d, "vllm:num_requests_running") for d in scrapes) >= 1
    assert max(value(d, "vllm:kv_cache_usage_perc") for d in scrapes) > 0
    generated = [value(d, "vllm:generation_tokens") for d in scrapes + [final]]
    assert generated == sorted(generated) and len(scrapes) >= 5
    # At the end: idle, and every number equals the trace's.
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert value(final, gauge) == 0
    reqs = trace.requests
    started = [r for r in reqs if r.output_ids]
    assert value(final, "vllm:generation_tokens") == sum(len(r.output_ids) for r in reqs)
    assert value(final, "vllm:prompt_tokens") == sum(r.prompt_len for r in started)
    success = final[final["sample"] == "vllm:request_success_total"]
    by_reason = {row.labels["finished_reason"]: row.value for row in success.itertuples()}
    assert by_reason == {"length": 12, "stop": 0, "abort": 2, "error": 0, "repetition": 0}
    per_request = metrics.per_request_metrics(trace)
    gaps = np.concatenate([np.diff(r.token_times) for r in started])
    for family, values in (("vllm:time_to_first_token_seconds", [r.token_times[0] - r.arrival_time for r in started]),
                           ("vllm:inter_token_latency_seconds", gaps),
                           ("vllm:e2e_request_latency_seconds", per_request["e2e"]),
                           ("vllm:request_queue_time_seconds", per_request["queue_time"])):
        assert histogram_buckets(final, family).iloc[-1] == len(values), family
        assert histogram_sum(final, family) == pytest.approx(float(np.sum(values)))
    assert len(trace.preemptions) > 0 and value(final, "vllm:num_preemptions") == len(trace.preemptions)
    prompt_len = {r.request_id: r.prompt_len for r in reqs}
    assert hit_tokens > 0 and value(final, "vllm:prefix_cache_hits") == hit_tokens
    assert value(final, "vllm:prefix_cache_queries") == sum(r.prompt_len for r in started) + sum(
        prompt_len[p.request_id] + p.num_output_tokens for p in trace.preemptions)
    # every step once, with the tokens it computed; a request's cached prompt tokens are where its
    # first chunk starts (re-admissions after a preemption count in prefix_cache_hits only)
    assert histogram_buckets(final, "vllm:iteration_tokens_total").iloc[-1] == len(trace.steps)
    assert histogram_sum(final, "vllm:iteration_tokens_total") == sum(step.num_tokens for step in trace.steps)
    first_start: dict[str, int] = {}
    for step in trace.steps:
        for c in step.chunks:
            first_start.setdefault(c.request_id, c.start)
    cached = sum(first_start[r.request_id] for r in started)
    assert 0 < value(final, "vllm:prompt_tokens_cached") == cached <= hit_tokens


def test_a_small_soak_with_a_trace_window(lm):
    """The soak script's load, 300 requests (streamed, whole, chat, disconnecting, refused), on a
    server that keeps 50 ended requests: every accepted request answered, the KV cache empty,
    /metrics counted all of them, the trace holds the last 50 and the steps since."""
    from batchlab.loadgen.prom import scrape, value
    from batchlab.loadgen.soak import soak
    with ServerThread(ServerConfig(engine=EngineArgs(max_num_seqs=16, max_model_len=128), trace_window=50), lm) as s:
        report = soak(s.url, 300, concurrency=16, seed=3)
        idle = wait_until_idle(s.url)
        ended = value(scrape(s.url), "vllm:request_success")
    assert not report.failures, report.failures[:5]
    assert {kind for kind, _ in report.outcomes} == {"stream", "whole", "chat", "disconnect", "bad"}
    assert report.num_accepted == idle["accepted"] == ended and idle["in_flight"] == idle["kv_used_tokens"] == 0
    trace = s.runner.trace                 # trimmed every 50 // 8 ends: it keeps 50 to 56
    assert 50 <= len(trace.requests) <= 56 and trace.meta["num_forgotten"] == ended - len(trace.requests)
    oldest = min(r.arrival_time for r in trace.requests)
    assert trace.steps and all(step.start >= oldest for step in trace.steps)
