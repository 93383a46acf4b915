"""Prefill here, decode there, for real: the KV hand-off on the real model (``Request.kv_export``,
``Request.kv_transfer``), between two servers (``batchlab.serve.kv_transfer``), and behind
``vllm-router --vllm-pd-disaggregation`` (``batchlab.launch.pd_loopback``).

The invariant: in fp32, greedy answers served split (prompt computed by one worker, its KV moved,
decoded by another) are the answers of one colocated server, token for token. The faults of the
hand-off each end the request with the reason (or, under ``"recompute"``, the decode worker
computes the prompt), and the servers serve the next request.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
import torch

from batchlab.backends import ModelBackend
from batchlab.sim import SimBackend
from batchlab.launch.pd_loopback import PDLoopback, PDLoopbackConfig
from batchlab.engine_args import EngineArgs
from batchlab.contract import fresh_workload
from batchlab.engine import Engine
from batchlab.listener import EngineListener
from batchlab.loop import Workload, run_until
from batchlab.model.divergence import NEAR_TIE, parted_between
from batchlab.model.llama import LlamaWeights
from batchlab.requests import KVCopy, KVTransfer, Request
from batchlab.schedulers import ContinuousBatcher
from batchlab.serve import ServerConfig, ServerThread
from batchlab.launch import launch_server, wait_ready
from batchlab.serve.kv_transfer import CONNECTOR, META_HEADER, KVTransferConfig

MODEL = "SmolLM2-135M-Instruct"
PROMPTS = ["The three most important ideas in batching are", "Write a short poem about the sea.",
           "def fibonacci(n):", "Explain KV caches to a new engineer in two sentences."]


def transfer(**extra) -> KVTransferConfig:
    policy = extra.pop("policy", "fail")
    role = extra.pop("role", "kv_both")
    return KVTransferConfig.parse(json.dumps({"kv_connector": CONNECTOR, "kv_role": role,
                                              "kv_load_failure_policy": policy, "kv_connector_extra_config": extra}))


def small(**knobs) -> ServerConfig:
    """A server with a small KV cache (the default one, 32 x 1,024 tokens in fp32, is 1.5 GB)."""
    return ServerConfig.of(max_num_seqs=4, max_model_len=256, **knobs)


def body(prompt: str, max_tokens: int = 24, **more) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **more}


def prefill_part(url: str, prompt: str) -> dict:
    """What vllm-router sends a prefill worker (its captured body), and the params it answers."""
    asks = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None}
    r = httpx.post(f"{url}/v1/completions", json=body(prompt, 1, stream=False, kv_transfer_params=asks), timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["kv_transfer_params"]


def text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


# --- the engine: KV out of one cache, into another ------------------------------------------------
class Exports(EngineListener):
    """The prompt KV each finished ``kv_export`` request handed over."""

    def __init__(self) -> None:
        self.kv: dict[str, KVCopy] = {}

    def on_kv_export(self, req: Request, kv: KVCopy) -> None:
        self.kv[req.request_id] = kv


def engine_outputs(lm, requests, paged: bool, block_size: int = 16):
    """Serve ``requests`` on the model; their outputs, the engine, and the KV they exported."""
    engine, exports = Engine(ContinuousBatcher(8, 256), ModelBackend(lm, 8, 256, paged=paged,
                                                                     block_size=block_size)), Exports()
    run_until(engine, Workload(fresh_workload(requests)), engine.start(exports))
    trace = engine.finish()
    return {r.request_id: r.output_ids for r in trace.requests}, engine, exports.kv


@pytest.mark.parametrize("paged", [False, True], ids=["slots", "paged"])
def test_transferred_kv_gives_the_colocated_greedy_tokens(lm, paged):
    ids = [lm.tokenizer.encode(p) for p in PROMPTS]
    reqs = [Request(f"r{i}", x, 24) for i, x in enumerate(ids)]
    colocated, _, _ = engine_outputs(lm, reqs, paged)
    _, _, exported = engine_outputs(lm, [r.fresh_copy(max_new_tokens=1, kv_export=True) for r in reqs], paged)
    assert all(tuple(exported[r.request_id].kv.shape[:2]) == (30, len(x)) for r, x in zip(reqs, ids))
    split = [r.fresh_copy(kv_transfer=KVTransfer(r.prompt_len - 1, exported[r.request_id].kv)) for r in reqs]
    decoded, decode, _ = engine_outputs(lm, split, paged, block_size=32)
    if lm.dtype == "float32":
        assert decoded == colocated
    else:   # the last prompt token computed alone, not in the prompt's step: bf16 may part at near-ties
        parted = parted_between(LlamaWeights.from_hf(lm.model), {r.request_id: r.prompt_ids for r in reqs},
                                {"colocated": colocated, "split": decoded})
        assert all(margin < NEAR_TIE for _, margin in parted.values()), parted
    first = decode.steps[0]
    assert [(c.start, c.num_tokens) for c in first.chunks] == [(len(x) - 1, 1) for x in ids]
    assert all(r.kv_transfer.kv is None for r in decode.requests.values())        # dropped once written
    # The KV is what makes the answer: zeros in its place change it.
    blank = [r.fresh_copy(kv_transfer=KVTransfer(r.prompt_len - 1, torch.zeros_like(r.kv_transfer.kv))) for r in split]
    wrong, _, _ = engine_outputs(lm, blank, paged)
    assert wrong != colocated


def test_a_simulated_cache_exports_its_blocks_without_values():
    backend = SimBackend.__new__(SimBackend)       # (read_kv only reads the cache's block table)
    from batchlab.kv_blocks import BlockManager
    backend.kv = BlockManager(num_blocks=8, block_size=16)
    backend.kv.admit("r", 40, 48)
    copy = backend.read_kv("r", 40)
    assert copy.kv is None and copy.block_ids == backend.kv.block_table("r") and len(copy.block_ids) == 3


def test_a_bad_transferred_kv_is_named():
    with pytest.raises(ValueError, match="kv_transfer.kv of shape"):
        KVTransfer(2, torch.zeros(30, 1, 2, 3, 64))
    with pytest.raises(ValueError, match="kv_export=1"):
        Request("r", [1, 2, 3], 4, kv_export=1)


# --- two servers in this process: the protocol and its faults ------------------------------------
@pytest.fixture(scope="module")
def servers(lm):
    """A colocated server, a prefill and a decode worker (in this process: one loaded model)."""
    with ServerThread(small(paged=True), lm) as colocated, \
            ServerThread(small(paged=True, kv_transfer_config=transfer()), lm) as prefill, \
            ServerThread(small(paged=True, block_size=32, kv_transfer_config=transfer()), lm) as decode:
        yield colocated, prefill, decode


def test_the_decode_worker_answers_as_the_colocated_server(lm, servers):
    colocated, prefill, decode = servers
    for prompt in PROMPTS[:2]:
        params = prefill_part(prefill.url, prompt)
        assert params["do_remote_prefill"] is True and params["remote_port"] == prefill.port
        assert params["remote_num_tokens"] == len(httpx.post(f"{prefill.url}/tokenize",
                                                             json={"model": MODEL, "prompt": prompt}).json()["tokens"])
        r = httpx.post(f"{decode.url}/v1/completions", json=body(prompt, kv_transfer_params=params), timeout=60)
        if lm.dtype == "float32":   # (bf16 may part at near-ties: the engine test above measures them)
            assert text(r) == text(httpx.post(f"{colocated.url}/v1/completions", json=body(prompt), timeout=60))
        hand_off = r.json()["batchlab"]["kv_transfer"]
        assert hand_off["part"] == "decode" and hand_off["kv_tokens"] == params["remote_num_tokens"] - 1
        per_token = 30 * 2 * 3 * 64 * lm.model.dtype.itemsize          # layers x (K, V) x heads x head dim
        assert hand_off["kv_bytes"] == params["remote_num_tokens"] * per_token and hand_off["transfer_s"] > 0
    assert httpx.get(f"{prefill.url}/batchlab/stats").json()["kv_exports_held"] == 0     # read, so freed
    metrics = httpx.get(f"{decode.url}/metrics").text
    line = next(x for x in metrics.splitlines() if 'source="external_kv_transfer"' in x and x.startswith("vllm:prompt"))
    assert float(line.split()[-1]) >= 2


def test_a_second_read_a_dead_prefill_worker_or_another_prompt_end_with_the_reason(servers):
    _, prefill, decode = servers
    params = prefill_part(prefill.url, PROMPTS[0])
    wrong = httpx.post(f"{decode.url}/v1/completions", json=body(PROMPTS[1], kv_transfer_params=params), timeout=60)
    assert wrong.status_code == 400 and "for another prompt" in wrong.json()["error"]["message"]
    again = httpx.post(f"{decode.url}/v1/completions", json=body(PROMPTS[0], kv_transfer_params=params), timeout=60)
    assert again.status_code == 502 and "was already read" in again.json()["error"]["message"]
    dead = {**params, "remote_port": free_port()}
    r = httpx.post(f"{decode.url}/v1/completions", json=body(PROMPTS[0], kv_transfer_params=dead), timeout=60)
    assert r.status_code == 502 and "did not deliver the KV" in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "kv_transfer_error"
    text(httpx.post(f"{decode.url}/v1/completions", json=body(PROMPTS[2]), timeout=60))    # still serving


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SilentPeer:
    """A 'prefill worker' that accepts connections and then says nothing (``cut``: or answers
    with a KV header promising more bytes than it sends, then hangs up)."""

    def __init__(self, cut: bool = False) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port, self.cut, self.conns = self.sock.getsockname()[1], cut, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.cut:
                conn.recv(65536)
                meta = json.dumps({"shape": [30, 9, 2, 3, 64], "bytes": 414720})
                conn.sendall(f"HTTP/1.1 200 OK\r\ncontent-length: 414720\r\n{META_HEADER}: {meta}\r\n\r\n".encode()
                             + b"\0" * 1000)
                conn.close()

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def test_kv_that_never_comes_or_comes_cut_short_ends_with_the_reason(lm):
    config = small(paged=True, kv_transfer_config=transfer(kv_fetch_timeout=1.0))
    silent, cut = SilentPeer(), SilentPeer(cut=True)
    try:
        with ServerThread(config, lm) as decode:
            asks = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_request_id": "cmpl-x"}
            start = time.monotonic()
            r = httpx.post(f"{decode.url}/v1/completions", timeout=60,
                           json=body(PROMPTS[0], kv_transfer_params={**asks, "remote_port": silent.port}))
            assert r.status_code == 504 and "within kv_fetch_timeout=1 s" in r.json()["error"]["message"]
            assert 1.0 <= time.monotonic() - start < 10
            r = httpx.post(f"{decode.url}/v1/completions", timeout=60,
                           json=body(PROMPTS[0], kv_transfer_params={**asks, "remote_port": cut.port}))
            assert r.status_code == 502 and "did not deliver the KV" in r.json()["error"]["message"]
            assert httpx.get(f"{decode.url}/batchlab/stats").json()["in_flight"] == 0
    finally:
        silent.close()
        cut.close()


def test_an_unread_export_is_dropped_after_its_lease_and_the_decode_worker_says_so(lm):
    with ServerThread(small(paged=True, kv_transfer_config=transfer(kv_lease_duration=0.3)), lm) as prefill, \
            ServerThread(small(paged=True, kv_transfer_config=transfer()), lm) as decode:
        params = prefill_part(prefill.url, PROMPTS[0])
        time.sleep(0.6)
        r = httpx.post(f"{decode.url}/v1/completions", json=body(PROMPTS[0], kv_transfer_params=params), timeout=60)
        assert r.status_code == 502 and "dropped unread after its lease of 0.3 s" in r.json()["error"]["message"]
        assert httpx.get(f"{prefill.url}/batchlab/stats").json()["kv_exports_expired"] == 1


def test_a_block_size_mismatch_is_refused_as_vllm_would_and_recompute_serves_anyway(lm, servers):
    colocated, _, _ = servers
    with ServerThread(small(paged=True, block_size=32, kv_transfer_config=transfer()), lm) as prefill, \
            ServerThread(small(paged=True, block_size=16, kv_transfer_config=transfer()), lm) as strict, \
            ServerThread(small(paged=True, kv_transfer_config=transfer(policy="recompute")), lm) as lenient:
        r = httpx.post(f"{strict.url}/v1/completions", timeout=60,
                       json=body(PROMPTS[1], kv_transfer_params=prefill_part(prefill.url, PROMPTS[1])))
        assert r.status_code == 400
        assert "block size mismatch: the prefill worker's KV blocks hold 32 tokens and this worker's 16" \
            in r.json()["error"]["message"]
        r = httpx.post(f"{lenient.url}/v1/completions", timeout=60,
                       json=body(PROMPTS[1], kv_transfer_params=prefill_part(prefill.url, PROMPTS[1])))
        assert text(r) == text(httpx.post(f"{colocated.url}/v1/completions", json=body(PROMPTS[1]), timeout=60))
        assert r.json()["batchlab"]["kv_transfer"]["recomputed"] is True


def test_roles_streams_and_servers_without_a_connector(lm, servers):
    colocated, prefill, _ = servers
    with ServerThread(small(paged=True, kv_transfer_config=transfer(role="kv_consumer")), lm) as consumer:
        r = httpx.post(f"{consumer.url}/v1/completions",
                       json=body(PROMPTS[0], 1, kv_transfer_params={"do_remote_decode": True}))
        assert r.status_code == 400 and "its kv_role is 'kv_consumer'" in r.json()["error"]["message"]
    r = httpx.post(f"{prefill.url}/v1/completions",
                   json=body(PROMPTS[0], 1, stream=True, kv_transfer_params={"do_remote_decode": True}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
    r = httpx.post(f"{prefill.url}/v1/completions", json=body(PROMPTS[0], kv_transfer_params={"do_remote_prefill": True}))
    assert r.status_code == 400 and "need remote_host" in r.json()["error"]["message"]
    # A server without --kv-transfer-config computes the prompt itself (the field is ignored, logged).
    r = httpx.post(f"{colocated.url}/v1/completions", json=body(PROMPTS[0], kv_transfer_params={"do_remote_decode": True}))
    assert r.status_code == 200 and "kv_transfer_params" not in r.json()
    assert httpx.get(f"{colocated.url}/batchlab/kv/anything").status_code == 404


@pytest.mark.parametrize("config, message", [
    ('{"kv_connector": "NixlConnector"}', "kv_connector='NixlConnector'; must be 'HTTPKVConnector'"),
    ('{"kv_connector": "HTTPKVConnector", "kv_role": "both"}', "kv_role='both'"),
    ('{"kv_connector": "HTTPKVConnector", "kv_load_failure_policy": "retry"}', "kv_load_failure_policy='retry'"),
    ('{"kv_connector": "HTTPKVConnector", "kv_connector_extra_config": {"lease": 3}}', "keys among"),
    ('{"kv_connector": "HTTPKVConnector", "kv_connector_extra_config": {"kv_lease_duration": -1}}',
     "kv_lease_duration=-1"),
    ('{"kv_connector": "HTTPKVConnector", "kv_connector_extra_config": {"link": "wifi"}}', "link='wifi'"),
    ('{"kv_connector": "HTTPKVConnector", "kv_buffer_size": 1}', "allowed: kv_connector"),
    ("kv_both", "is not JSON"),
])
def test_bad_transfer_configs_are_named(config, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        KVTransferConfig.parse(config)


def test_the_hand_off_needs_continuous_batching_on_blocks():
    with pytest.raises(ValueError, match="must come with policy='continuous' and paged=True"):
        ServerConfig(kv_transfer_config=transfer())
    with pytest.raises(ValueError, match="num_decode=0"):
        PDLoopbackConfig(num_decode=0)


# --- behind vllm-router --vllm-pd-disaggregation, each worker a process of its own ------------------
def test_the_real_router_serves_split_as_one_colocated_server(tmp_path):
    config = PDLoopbackConfig(threads=1, engine=EngineArgs(max_num_seqs=4, max_model_len=256),
                              dtype="float32")   # exact in any run
    colocated = launch_server(threads=1, dtype="float32", config=config.colocated_config())
    try:
        with PDLoopback(config) as pd:
            wait_ready(colocated)
            for prompt in PROMPTS:
                assert text(httpx.post(f"{pd.url}/v1/completions", json=body(prompt), timeout=120)) == \
                    text(httpx.post(f"{colocated.url}/v1/completions", json=body(prompt), timeout=120))
            chat = {"model": MODEL, "messages": [{"role": "user", "content": PROMPTS[3]}], "max_tokens": 16,
                    "temperature": 0, "stream": True}
            with httpx.stream("POST", f"{pd.url}/v1/chat/completions", json=chat, timeout=120) as s:
                lines = [line for line in s.iter_lines() if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]"
            last = json.loads(lines[-2].removeprefix("data: "))
            assert last["batchlab"]["kv_transfer"]["part"] == "decode" and last["batchlab"]["status"] == "finished"
            # A dead prefill worker: the router answers the client with an error, nothing hangs.
            pd.kill("prefill", 0)
            r = httpx.post(f"{pd.url}/v1/completions", json=body(PROMPTS[0]), timeout=120)
            assert r.status_code >= 500
    finally:
        colocated.stop()


def test_simulated_workers_wait_the_links_transfer_time():
    """A simulated decode worker admits the request, holds its blocks for the link's time, then
    computes the last prompt token: its own TTFT includes the transfer."""
    config = PDLoopbackConfig(simulate="H100", link="ethernet-25g",
                              engine=EngineArgs(max_model_len=4096, max_num_batched_tokens=2048))
    with PDLoopback(config) as pd:
        prompt = "word " * 2000
        r = httpx.post(f"{pd.url}/v1/completions", json=body(prompt, 8), timeout=120)
        assert r.status_code == 200, r.text
        timings = r.json()["batchlab"]
        hand_off = timings["kv_transfer"]
        # Llama-3-8B in bf16: 128 KiB of KV a token; 25 Gb/s moves 2,000 tokens' in about 84 ms.
        expected = hand_off["kv_bytes"] / 3.125e9
        assert hand_off["kv_bytes"] == (hand_off["kv_tokens"] + 1) * 131072
        assert expected <= hand_off["transfer_s"] < expected + 1e-4          # the link's time, with its latency
        assert timings["first_scheduled_time"] - timings["arrival_time"] >= expected     # nothing computed before
