"""The load client: streams requests to any OpenAI-compatible server and records what it sees.

Two ways to load a server:

- **open loop** (``mode="open"``): each request is sent at its planned time (Poisson, gamma
  bursts, a fixed rate, or a workload file's arrival times), whether or not earlier ones have
  finished. Queueing at the server shows up as latency, as it does for real users.
- **closed loop** (``mode="closed"``): ``concurrency`` virtual users, each sending its next request
  the moment its last one ends. The server is never offered more than ``concurrency`` requests,
  so its queue never grows: a closed-loop benchmark hides queueing by construction.

Every request is a streaming completion (``"stream": true``), asking for usage in every chunk
(``stream_options.continuous_usage_stats``, which vLLM and batchlab support) so that the tokens
in each chunk are counted exactly; a server that ignores it is counted one token per non-empty
chunk, and the last chunk gets whatever the final usage adds. Greedy with ``ignore_eos`` by
default, so every request makes exactly its ``max_tokens`` (as serving benchmarks do).

A load generator that falls behind its plan measures the wrong thing; ``LoadResult.rate_report``
gives the achieved arrival rate against the plan's and says when sends were late.
Everything is bounded: a request count, a per-request timeout and ``max_duration`` for the whole
load, after which requests still in flight are cancelled and recorded as such.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import time
import warnings
from collections import deque
from dataclasses import dataclass, field

import httpx
import numpy as np

from batchlab.loadgen.records import ClientRecord, chunk_gaps, client_trace, server_trace
from batchlab.requests import Request

MODES = ("open", "closed")
ENDPOINTS = ("completions", "chat")
LATE_SEND_S = 0.010      # a send this much after its planned time counts as late


@dataclass(frozen=True)
class LoadRequest:
    """One request to send: ``prompt`` is text or token ids (completions only); ``arrival_time``
    is when to send it in open loop (seconds after the load starts; ignored in closed loop)."""

    request_id: str
    prompt: str | list[int]
    max_tokens: int
    arrival_time: float = 0.0
    prompt_len: int = -1

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id={self.request_id!r}; must be a non-empty string")
        if not (isinstance(self.prompt, str) and self.prompt) and not (
                isinstance(self.prompt, list) and self.prompt and all(isinstance(t, int) for t in self.prompt)):
            raise ValueError(f"request {self.request_id!r}: prompt must be a non-empty string or list of token ids")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"request {self.request_id!r}: max_tokens={self.max_tokens!r}; must be an int >= 1")
        if not (isinstance(self.arrival_time, (int, float)) and math.isfinite(self.arrival_time)
                and self.arrival_time >= 0):
            raise ValueError(f"request {self.request_id!r}: arrival_time={self.arrival_time!r}; must be >= 0")


def from_workload(requests: list[Request]) -> list[LoadRequest]:
    """Load requests from a batchlab workload (token-id prompts, its arrival times and lengths)."""
    out = []
    for r in requests:
        if r.prompt_ids is None:
            raise ValueError(f"request {r.request_id!r} is simulated (no prompt_ids); build the workload "
                             "with a tokenizer (make_workload(..., tokenizer=tok) or load_workload(path, tok))")
        out.append(LoadRequest(r.request_id, list(r.prompt_ids), r.max_new_tokens, r.arrival_time, r.prompt_len))
    return out


@dataclass
class LoadResult:
    """What one load run recorded, with the client-side ``trace`` built from it."""

    records: list[ClientRecord]
    mode: str
    url: str
    model: str
    concurrency: int | None
    target_rate: float | None
    wall_seconds: float
    meta: dict = field(default_factory=dict)

    @property
    def trace(self):
        """The client's view as a batchlab ``Trace`` (``records.client_trace``)."""
        return client_trace(self.records, {"mode": self.mode, "url": self.url, **self.meta})

    def server_trace(self):
        """The engine's own times for the same requests, on the client's clock (batchlab's server)."""
        return server_trace(self.records, {"mode": self.mode, "url": self.url})

    def chunk_gaps(self) -> np.ndarray:
        return chunk_gaps(self.records)

    def status_counts(self) -> dict:
        counts: dict = {}
        for r in self.records:
            key = r.status_code if r.status_code is not None else (r.error or "not sent").split(":")[0]
            counts[key] = counts.get(key, 0) + 1
        return counts

    def rate_report(self) -> dict:
        """Planned against achieved arrival rate, and how late the sends were.

        ``planned_rate``: (n - 1) / span of the planned send times (this sample of the arrival
        process, not its nominal rate, which is ``target_rate``); ``achieved_rate``: the same over
        the real send times. ``behind`` is True when more than 1% of sends were later than
        ``LATE_SEND_S`` or the last send was late by more than 5% of the span.
        """
        sent = sorted((r for r in self.records if r.send_time is not None), key=lambda r: r.scheduled_time)
        planned = np.array([r.scheduled_time for r in sent])
        actual = np.array([r.send_time for r in sent])
        lag = actual - planned if len(sent) else np.empty(0)

        def rate(t: np.ndarray) -> float:
            return (len(t) - 1) / (t.max() - t.min()) if len(t) > 1 and t.max() > t.min() else float("nan")

        report = {"mode": self.mode, "num_planned": len(self.records), "num_sent": len(sent),
                  "target_rate": self.target_rate, "planned_rate": rate(planned) if self.mode == "open" else None,
                  "achieved_rate": rate(actual),
                  "send_lag_p50_s": float(np.percentile(lag, 50)) if len(lag) else float("nan"),
                  "send_lag_p99_s": float(np.percentile(lag, 99)) if len(lag) else float("nan"),
                  "send_lag_max_s": float(lag.max()) if len(lag) else float("nan")}
        if self.mode == "open" and len(sent) > 1:
            span = planned.max() - planned.min()
            report["behind"] = bool(np.mean(lag > LATE_SEND_S) > 0.01 or lag[-1] > 0.05 * span + LATE_SEND_S)
        else:
            report["behind"] = False
        report["all_sent"] = len(sent) == len(self.records)
        return report

    def table(self, percentiles=(50, 90, 99)):
        """``batchlab.analysis.metrics.summarize`` of the client's trace (ttft, tpot, itl, e2e, queue_time)."""
        from batchlab.analysis.metrics import summarize
        return summarize(self.trace, percentiles=percentiles)

    def summary(self) -> str:
        rr = self.rate_report()
        ok = sum(r.ok for r in self.records)
        lines = [f"{self.mode} loop against {self.url} ({self.model}): {ok}/{len(self.records)} finished, "
                 f"statuses {self.status_counts()}, {self.wall_seconds:.1f} s"]
        if self.mode == "open":
            lines.append(f"arrival rate: target {self.target_rate}, planned {rr['planned_rate']:.3f}/s, achieved "
                         f"{rr['achieved_rate']:.3f}/s; send lag p99 {rr['send_lag_p99_s'] * 1e3:.1f} ms"
                         + ("  << THE CLIENT FELL BEHIND ITS PLAN" if rr["behind"] else ""))
        else:
            lines.append(f"{self.concurrency} users; achieved arrival rate {rr['achieved_rate']:.3f}/s")
        return "\n".join(lines)


# --- one request ------------------------------------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.t0_unix = time.time()

    def now(self) -> float:
        return time.perf_counter() - self.t0


def _body(lr: LoadRequest, endpoint: str, model: str, sampling: dict) -> dict:
    body = {"model": model, "max_tokens": lr.max_tokens, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}, **sampling}
    if endpoint == "chat":
        if not isinstance(lr.prompt, str):
            raise ValueError(f"request {lr.request_id!r}: the chat endpoint needs a text prompt")
        body["messages"] = [{"role": "user", "content": lr.prompt}]
    else:
        body["prompt"] = lr.prompt
    return body


def _error_text(raw: bytes) -> str:
    try:
        err = json.loads(raw)
        if isinstance(err, dict) and isinstance(err.get("error"), dict):
            return str(err["error"].get("message"))
        return json.dumps(err)[:300]
    except ValueError:
        return raw[:300].decode(errors="replace")


async def _send(client: httpx.AsyncClient, path: str, body: dict, rec: ClientRecord, clock: _Clock) -> None:
    rec.send_time = clock.now()
    count = 0                     # completion tokens counted so far
    try:
        async with client.stream("POST", path, json=body) as r:
            rec.status_code = r.status_code
            if r.status_code != 200:
                rec.error = _error_text(await r.aread())
                return
            async for line in r.aiter_lines():
                t = clock.now()
                if not line.startswith("data:"):
                    continue              # blank separators and ": keepalive" comments
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk and not chunk.get("choices"):
                    rec.error = str((chunk["error"] or {}).get("message", chunk["error"]))
                    continue
                if chunk.get("batchlab"):
                    rec.server = chunk["batchlab"]
                usage = chunk.get("usage") or None
                if usage and usage.get("prompt_tokens") is not None:
                    rec.usage_prompt_tokens = usage["prompt_tokens"]
                choices = chunk.get("choices") or []
                for c in choices:
                    rec.text += c.get("text") or (c.get("delta") or {}).get("content") or ""
                    rec.finish_reason = c.get("finish_reason") or rec.finish_reason
                if not choices:           # the usage-only chunk at the end
                    if usage:
                        rec.usage_completion_tokens = usage.get("completion_tokens")
                    continue
                if usage and usage.get("completion_tokens") is not None:
                    new = usage["completion_tokens"] - count
                    rec.tokens_counted_by = "usage"
                else:
                    new = 1 if any(c.get("text") or (c.get("delta") or {}).get("content") for c in choices) else 0
                if new > 0:
                    count += new
                    rec.chunk_times.append(t)
                    rec.chunk_tokens.append(new)
            # A server that does not count per chunk: the final usage settles the total.
            final = rec.usage_completion_tokens
            if rec.tokens_counted_by == "chunks" and final is not None and rec.chunk_tokens and final > count:
                rec.chunk_tokens[-1] += final - count
    except asyncio.CancelledError:
        rec.error = "cancelled: the load's max_duration was reached"
        raise
    except (httpx.HTTPError, OSError, ValueError) as e:
        rec.error = f"{type(e).__name__}: {e}"
    finally:
        rec.end_time = clock.now()


# --- the load ---------------------------------------------------------------------------------------
async def run_load_async(url: str, requests: list[LoadRequest], mode: str = "open", concurrency: int | None = None,
                         model: str | None = None, endpoint: str = "completions", api_key: str | None = None,
                         temperature: float = 0.0, ignore_eos: bool = True, request_timeout: float = 300.0,
                         max_duration: float = 600.0, target_rate: float | None = None,
                         extra_body: dict | None = None) -> LoadResult:
    """Run one load (see the module docstring); ``run_load`` is the same from synchronous code."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; allowed: {list(MODES)}")
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint={endpoint!r}; allowed: {list(ENDPOINTS)}")
    if mode == "closed" and (not isinstance(concurrency, int) or concurrency < 1):
        raise ValueError(f"concurrency={concurrency!r}; closed loop needs an int >= 1 (the number of users)")
    if not requests or not all(isinstance(r, LoadRequest) for r in requests):
        raise ValueError("requests must be a non-empty list of LoadRequest (see from_workload)")
    if len({r.request_id for r in requests}) != len(requests):
        raise ValueError("request ids must be unique")
    if not (isinstance(max_duration, (int, float)) and 0 < max_duration < math.inf):
        raise ValueError(f"max_duration={max_duration!r}; a load must be bounded: give seconds > 0")
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency if mode == "closed" else max(len(requests), 1),
                          max_keepalive_connections=64)
    path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
    sampling = {"temperature": temperature, "ignore_eos": ignore_eos, **(extra_body or {})}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits,
                                 timeout=httpx.Timeout(request_timeout)) as client:
        if model is None:
            r = await client.get("/v1/models")
            r.raise_for_status()
            model = r.json()["data"][0]["id"]
        ordered = sorted(requests, key=lambda q: q.arrival_time) if mode == "open" else list(requests)
        bodies = [_body(lr, endpoint, model, sampling) for lr in ordered]   # bad prompts fail before any send
        clock = _Clock()
        records = [ClientRecord(lr.request_id, lr.prompt_len if lr.prompt_len > 0 else
                                (len(lr.prompt) if isinstance(lr.prompt, list) else -1),
                                lr.max_tokens, lr.arrival_time if mode == "open" else 0.0,
                                client_t0_unix=clock.t0_unix) for lr in ordered]
        tasks: list[asyncio.Task] = []

        async def open_loop() -> None:
            for lr, body, rec in zip(ordered, bodies, records):
                delay = lr.arrival_time - clock.now()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(_send(client, path, body, rec, clock)))
            await asyncio.gather(*tasks, return_exceptions=True)

        async def closed_loop() -> None:
            todo = deque(zip(bodies, records))

            async def user() -> None:
                while todo:
                    body, rec = todo.popleft()
                    rec.scheduled_time = clock.now()
                    await _send(client, path, body, rec, clock)

            users = [asyncio.ensure_future(user()) for _ in range(concurrency)]
            tasks.extend(users)
            await asyncio.gather(*users, return_exceptions=True)

        main = asyncio.ensure_future(open_loop() if mode == "open" else closed_loop())
        try:
            await asyncio.wait_for(asyncio.shield(main), max_duration)
        except asyncio.TimeoutError:
            for t in tasks:
                t.cancel()
            main.cancel()
            await asyncio.gather(main, *tasks, return_exceptions=True)
            for rec in records:
                if rec.send_time is None:
                    rec.error = "not sent: the load's max_duration was reached"
            warnings.warn(f"the load reached max_duration={max_duration} s; requests still in flight were "
                          "cancelled and are recorded as such", stacklevel=2)
        wall = clock.now()
    result = LoadResult(records, mode, url, model, concurrency, target_rate, wall)
    if mode == "open" and result.rate_report()["behind"]:
        warnings.warn("the load client fell behind its arrival plan: " + result.summary().splitlines()[1],
                      stacklevel=2)
    return result


def run_load(url: str, requests: list[LoadRequest], **kwargs) -> LoadResult:
    """``run_load_async`` from synchronous code, also inside Jupyter (which already runs a loop:
    then the load runs on a thread of its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_load_async(url, requests, **kwargs))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run_load_async(url, requests, **kwargs)).result()
