"""batchlab's OpenAI-compatible server on 127.0.0.1, with the real model.

Bounded: every request asks for a few tokens, every wait has a timeout, and the servers stop at
the end of the module. No timing is asserted.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from batchlab.backends import ModelBackend
from batchlab.engine import Engine
from batchlab.requests import Request
from batchlab.schedulers import ContinuousBatcher
from batchlab.serve import ServerConfig, ServerThread, start_server

TIMEOUT = httpx.Timeout(120.0)
WORDS = ["river", "mountain", "garden", "engine", "violin", "market", "winter", "planet"]


def prompts(n: int) -> list[str]:
    return [f"Tell me about the {WORDS[i % 8]} number {i}:" for i in range(n)]


@pytest.fixture(scope="module")
def server(lm):
    config = ServerConfig(policy="continuous", max_num_seqs=64, max_model_len=128, max_num_batched_tokens=512)
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
    offline = Engine(ContinuousBatcher(max_num_seqs=64), ModelBackend(lm, max_num_seqs=64, max_seq_len=128)).run(reqs)
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
    config = ServerConfig(policy="continuous", max_num_seqs=2, max_model_len=128, max_waiting=2)
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
    config = ServerConfig(policy="static", batch_size=2, max_num_seqs=2, max_model_len=128, max_waiting=2)
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
    assert "server shutting down (SIGTERM)" in res["batchlab"]["finish_detail"]
    assert 0 < len(res["batchlab"]["token_ids"]) < 200
    # uvicorn re-raises the signal it handled once it has shut down cleanly, so the exit is "by SIGTERM".
    assert code in (0, -15) and "Traceback" not in server.log()
