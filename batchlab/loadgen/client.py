"""The load client: streams requests to any OpenAI-compatible server and records what it sees.

The rules and their reasons: ``docs/serving-over-http.md``.
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
from tqdm.auto import tqdm

from batchlab.checks import check_int, check_number
from batchlab.loadgen.records import ClientRecord, chunk_gaps, client_trace, server_trace
from batchlab.requests import Request

MODES = ("open", "closed")
ENDPOINTS = ("completions", "chat")
LATE_SEND_S = 0.010      # a send this much after its planned time counts as late
# An idle connection is dropped before the server's keep-alive (uvicorn's and vLLM's: 5 s) would
# close it, so a request is never sent on a connection the server is closing (a ReadError).
KEEPALIVE_S = 2.0


@dataclass(frozen=True)
class LoadRequest:
    """One request to send: ``prompt`` is text or token ids (completions only), or ``messages``
    (chat: a list of ``{"role", "content"}``); ``arrival_time`` is when to send it in open loop
    (seconds after the load starts; ignored in closed loop); ``prompt_len`` its tokens, if known;
    ``extra_body``: fields for this request alone (e.g. vLLM's ``{"cache_salt": "..."}``), over the
    load's own ``extra_body``."""

    request_id: str
    prompt: str | list[int] | None
    max_tokens: int
    arrival_time: float = 0.0
    prompt_len: int = -1
    messages: list[dict] | None = None
    extra_body: dict | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id={self.request_id!r}; must be a non-empty string")
        if self.messages is not None:
            if not (isinstance(self.messages, list) and self.messages
                    and all(isinstance(m, dict) and "role" in m and "content" in m
                            for m in self.messages)):
                raise ValueError(f"request {self.request_id!r}: messages must be a non-empty "
                                 "list of {role, content} objects")
        elif not (isinstance(self.prompt, str) and self.prompt) and not (
                isinstance(self.prompt, list) and self.prompt
                and all(isinstance(t, int) for t in self.prompt)):
            raise ValueError(f"request {self.request_id!r}: prompt must be a non-empty string or "
                             "list of token ids")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"request {self.request_id!r}: max_tokens={self.max_tokens!r}; "
                             "must be an int >= 1")
        if not (isinstance(self.arrival_time, (int, float)) and math.isfinite(self.arrival_time)
                and self.arrival_time >= 0):
            raise ValueError(f"request {self.request_id!r}: arrival_time={self.arrival_time!r}; "
                             "must be >= 0")
        if self.extra_body is not None and not isinstance(self.extra_body, dict):
            raise ValueError(f"request {self.request_id!r}: extra_body={self.extra_body!r}; "
                             "must be a dict or None")


def from_workload(requests: list[Request]) -> list[LoadRequest]:
    """Load requests from a batchlab workload (token-id prompts, its arrival times and lengths)."""
    out = []
    for r in requests:
        if r.prompt_ids is None:
            raise ValueError(f"request {r.request_id!r} is simulated (no prompt_ids); build the "
                             "workload with a tokenizer (make_workload(..., tokenizer=tok) or "
                             "load_workload(path, tok))")
        out.append(LoadRequest(r.request_id, list(r.prompt_ids), r.max_new_tokens, r.arrival_time,
                               r.prompt_len))
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
    warmup: list[ClientRecord] = field(default_factory=list)   # sent first, left out of the results
    # max_duration was reached: requests in flight were cancelled
    cut: bool = False
    max_concurrency: int | None = None

    @property
    def trace(self):
        """The client's view as a batchlab ``Trace`` (``records.client_trace``)."""
        return client_trace(self.records, {"mode": self.mode, "url": self.url, **self.meta})

    def server_trace(self):
        """The engine's own times for the same requests, on the client's clock (batchlab's
        server)."""
        return server_trace(self.records, {"mode": self.mode, "url": self.url})

    def chunk_gaps(self) -> np.ndarray:
        return chunk_gaps(self.records)

    def status_counts(self) -> dict[str, int]:
        """How many requests ended each way (``ClientRecord.outcome``: "ok", "HTTP 429", ...)."""
        counts: dict[str, int] = {}
        for r in self.records:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (kv[0] != "ok", kv[0])))

    def goodput(self, slo) -> float:
        """vLLM's goodput: finished requests meeting every bound of ``slo`` per second of the
        run."""
        from batchlab.analysis.metrics import goodput
        return goodput(self.trace, slo)

    def rate_report(self) -> dict:
        """Planned against achieved arrival rate, and how late the sends were.

        ``planned_rate``: (n - 1) / span of the planned send times (this sample of the arrival
        process, not its nominal rate, which is ``target_rate``); ``achieved_rate``: the same over
        the real send times. ``behind`` is True when more than 1% of sends were later than
        ``LATE_SEND_S`` or the last send was late by more than 5% of the span.
        """
        sent = sorted((r for r in self.records if r.send_time is not None),
                      key=lambda r: r.scheduled_time)
        planned = np.array([r.scheduled_time for r in sent])
        actual = np.array([r.send_time for r in sent])
        lag = actual - planned if len(sent) else np.empty(0)

        def rate(t: np.ndarray) -> float:
            return ((len(t) - 1) / (t.max() - t.min()) if len(t) > 1 and t.max() > t.min()
                    else float("nan"))

        report = {"mode": self.mode, "num_planned": len(self.records), "num_sent": len(sent),
                  "target_rate": self.target_rate,
                  "planned_rate": rate(planned) if self.mode == "open" else None,
                  "achieved_rate": rate(actual),
                  "send_lag_p50_s": float(np.percentile(lag, 50)) if len(lag) else float("nan"),
                  "send_lag_p99_s": float(np.percentile(lag, 99)) if len(lag) else float("nan"),
                  "send_lag_max_s": float(lag.max()) if len(lag) else float("nan")}
        # at_once has no rate to keep
        if self.mode == "open" and len(sent) > 1 and planned.max() > planned.min():
            span = planned.max() - planned.min()
            report["behind"] = bool(np.mean(lag > LATE_SEND_S) > 0.01
                                    or lag[-1] > 0.05 * span + LATE_SEND_S)
        else:
            report["behind"] = False
        report["all_sent"] = len(sent) == len(self.records)
        return report

    def table(self, percentiles=(50, 90, 99)):
        """``batchlab.analysis.metrics.summarize`` of the client's trace (ttft, tpot, itl, e2e,
        queue_time)."""
        from batchlab.analysis.metrics import summarize
        return summarize(self.trace, percentiles=percentiles)

    def summary(self) -> str:
        rr = self.rate_report()
        ok = sum(r.ok for r in self.records)
        lines = [f"{self.mode} loop against {self.url} ({self.model}): {ok}/{len(self.records)} "
                 f"finished, outcomes {self.status_counts()}, {self.wall_seconds:.1f} s"]
        if self.warmup:
            lines.append(f"warm-up: {len(self.warmup)} requests first "
                         f"({sum(r.ok for r in self.warmup)} ok), not counted")
        if self.mode == "open":
            cap = f", at most {self.max_concurrency} in flight" if self.max_concurrency else ""
            lines.append(f"arrival rate: target {self.target_rate}, planned "
                         f"{rr['planned_rate']:.3f}/s, achieved {rr['achieved_rate']:.3f}/s{cap}; "
                         f"send lag p99 {rr['send_lag_p99_s'] * 1e3:.1f} ms")
            if rr["behind"]:
                why = (f"max_concurrency={self.max_concurrency} held requests back"
                       if self.max_concurrency
                       else "the latencies describe a lighter load than the plan")
                lines.append(f"BEHIND PLAN: the client sent at {rr['achieved_rate']:.3f}/s "
                             f"against the planned {rr['planned_rate']:.3f}/s (send lag max "
                             f"{rr['send_lag_max_s']:.3f} s): {why}")
        else:
            lines.append(f"{self.concurrency} users; achieved arrival rate "
                         f"{rr['achieved_rate']:.3f}/s")
        if self.cut:
            unfinished = sum(r.end_time is None
                             or (r.error or "").startswith(("cancelled", "not sent"))
                             for r in self.records)
            lines.append(f"CUT: the load reached max_duration={self.meta.get('max_duration')} s; "
                         f"{unfinished} requests were cancelled or never sent")
        return "\n".join(lines)

    def requests_df(self):
        """One row per request: the client's record (times in seconds since the load began)."""
        import pandas as pd
        rows = [{"request_id": r.request_id, "outcome": r.outcome, "status_code": r.status_code,
                 "finish_reason": r.finish_reason,
                 "prompt_len": r.usage_prompt_tokens or r.prompt_len,
                 "max_tokens": r.max_tokens, "num_tokens": r.num_tokens,
                 "num_chunks": len(r.chunk_times),
                 "scheduled_time": r.scheduled_time, "send_time": r.send_time, "ttft": r.ttft,
                 "end_time": r.end_time, "error": r.error} for r in self.records]
        return pd.DataFrame(rows)


# --- one request ---------------------------------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.t0_unix = time.time()

    def now(self) -> float:
        return time.perf_counter() - self.t0


def _body(lr: LoadRequest, endpoint: str, model: str, sampling: dict,
          continuous_usage_stats: bool = True) -> dict:
    options = {"include_usage": True,
               **({"continuous_usage_stats": True} if continuous_usage_stats else {})}
    body = {"model": model, "max_tokens": lr.max_tokens, "stream": True, "stream_options": options,
            **sampling, **(lr.extra_body or {})}
    if endpoint == "chat":
        if lr.messages is not None:
            body["messages"] = lr.messages
        elif isinstance(lr.prompt, str):
            body["messages"] = [{"role": "user", "content": lr.prompt}]
        else:
            raise ValueError(f"request {lr.request_id!r}: the chat endpoint needs text or "
                             "messages, not token ids")
    elif lr.messages is not None:
        raise ValueError(f"request {lr.request_id!r} has messages; send it with endpoint='chat'")
    else:
        body["prompt"] = lr.prompt
    return body


async def check_server(client: httpx.AsyncClient, url: str) -> str:
    """The first model the server lists; a ValueError naming the URL if it does not answer."""
    try:
        r = await client.get("/v1/models")
    except httpx.HTTPError as e:
        raise ValueError(f"url={url!r}; must be an OpenAI-compatible server that answers: "
                         f"GET /v1/models failed ({type(e).__name__}: {e})") from None
    if r.status_code != 200:
        raise ValueError(f"url={url!r}; must be an OpenAI-compatible server that answers: "
                         f"GET /v1/models gave HTTP {r.status_code}: {_error_text(r.content)}")
    try:
        return r.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ValueError(f"url={url!r}; must be an OpenAI-compatible server: its /v1/models "
                         f"answer lists no model ({r.text[:200]!r})") from None


def _error_text(raw: bytes) -> str:
    try:
        err = json.loads(raw)
        if isinstance(err, dict) and isinstance(err.get("error"), dict):
            return str(err["error"].get("message"))
        return json.dumps(err)[:300]
    except ValueError:
        return raw[:300].decode(errors="replace")


async def _send(client: httpx.AsyncClient, path: str, body: dict, rec: ClientRecord, clock: _Clock,
                tokenizer=None) -> None:
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
                    new = 1 if any(c.get("text") or (c.get("delta") or {}).get("content")
                                   for c in choices) else 0
                if new > 0:
                    count += new
                    rec.chunk_times.append(t)
                    rec.chunk_tokens.append(new)
            # A server that does not count per chunk: the final usage (else the tokenizer)
            # settles the total.
            final = rec.usage_completion_tokens
            if final is None and tokenizer is not None and rec.tokens_counted_by == "chunks":
                final = len(tokenizer(rec.text, add_special_tokens=False)["input_ids"])
            if (rec.tokens_counted_by == "chunks" and final is not None and rec.chunk_tokens
                    and final > count):
                rec.chunk_tokens[-1] += final - count
    except asyncio.CancelledError:
        rec.error = "cancelled: the load's max_duration was reached"
        raise
    except Exception as e:           # any failure is this request's outcome, never the load's crash
        rec.error = f"{type(e).__name__}: {e}"
    finally:
        rec.end_time = clock.now()


# --- the load ------------------------------------------------------------------------------------
def _check_load(mode: str, endpoint: str, concurrency, max_concurrency, requests, max_duration,
                request_timeout, warmup: int) -> None:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; must be one of {list(MODES)}")
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint={endpoint!r}; must be one of {list(ENDPOINTS)}")
    if mode == "closed":
        check_int("concurrency", concurrency, hint="closed loop needs the number of users")
    check_int("max_concurrency", max_concurrency, allow_none=True)
    check_int("warmup", warmup, 0)
    if not requests or not all(isinstance(r, LoadRequest) for r in requests):
        raise ValueError("requests must be a non-empty list of LoadRequest (see from_workload)")
    if len({r.request_id for r in requests}) != len(requests):
        raise ValueError("request ids must be unique")
    check_number("max_duration", max_duration, 0, strict=True,
                 hint="a load must be bounded: give seconds")
    check_number("request_timeout", request_timeout, 0, strict=True)


async def run_load_async(url: str, requests: list[LoadRequest], mode: str = "open",
                         concurrency: int | None = None,
                         model: str | None = None, endpoint: str = "completions",
                         api_key: str | None = None,
                         temperature: float = 0.0, ignore_eos: bool = True,
                         request_timeout: float = 300.0,
                         max_duration: float = 600.0, target_rate: float | None = None,
                         extra_body: dict | None = None, max_concurrency: int | None = None,
                         warmup: int = 0, progress: bool = False, tokenizer=None,
                         headers: dict[str, str] | None = None,
                         continuous_usage_stats: bool = True) -> LoadResult:
    """Run one load (see the module docstring); ``run_load`` is the same from synchronous code.

    ``extra_body``: more request fields (``top_p``, ``seed``, ``stop``...). ``tokenizer``: counts
    output tokens when the server reports no usage. ``progress``: a tqdm bar over the requests.
    ``ignore_eos=False`` and ``continuous_usage_stats=False`` leave those fields out of the body
    (a strict OpenAI server refuses fields it does not know); ``headers``: more HTTP headers.
    """
    _check_load(mode, endpoint, concurrency, max_concurrency, requests, max_duration,
                request_timeout, warmup)
    if headers is not None and not (isinstance(headers, dict)
                                    and all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in headers.items())):
        raise ValueError(f"headers={headers!r}; must be a dict of str to str, or None")
    url = url.rstrip("/")
    headers = {**({"Authorization": f"Bearer {api_key}"} if api_key else {}), **(headers or {})}
    in_flight = concurrency if mode == "closed" else (max_concurrency or len(requests))
    limits = httpx.Limits(max_connections=max(in_flight, warmup, 1), max_keepalive_connections=64,
                          keepalive_expiry=KEEPALIVE_S)
    path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
    sampling = {"temperature": temperature, **({"ignore_eos": True} if ignore_eos else {}),
                **(extra_body or {})}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits,
                                 timeout=httpx.Timeout(request_timeout)) as client:
        listed = await check_server(client, url)
        model = model or listed
        ordered = (sorted(requests, key=lambda q: q.arrival_time) if mode == "open"
                   else list(requests))
        # bad prompts fail before any send
        bodies = [_body(lr, endpoint, model, sampling, continuous_usage_stats) for lr in ordered]
        warm = await _warm_up(client, path, bodies, warmup, tokenizer)
        clock = _Clock()
        records = [ClientRecord(lr.request_id, lr.prompt_len if lr.prompt_len > 0 else
                                (len(lr.prompt) if isinstance(lr.prompt, list) else -1),
                                lr.max_tokens, lr.arrival_time if mode == "open" else 0.0,
                                client_t0_unix=clock.t0_unix) for lr in ordered]
        bar = tqdm(total=len(records), unit="req", desc=f"{mode} loop", disable=not progress,
                   leave=False)
        tasks: list[asyncio.Task] = []
        gate = asyncio.Semaphore(max_concurrency) if mode == "open" and max_concurrency else None

        async def send(body: dict, rec: ClientRecord) -> None:
            try:
                if gate is None:
                    await _send(client, path, body, rec, clock, tokenizer)
                else:
                    # vLLM's --max-concurrency: wait for a free slot, then send
                    async with gate:
                        await _send(client, path, body, rec, clock, tokenizer)
            finally:
                bar.update(1)

        async def open_loop() -> None:
            for lr, body, rec in zip(ordered, bodies, records):
                delay = lr.arrival_time - clock.now()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(send(body, rec)))
            await asyncio.gather(*tasks, return_exceptions=True)

        async def closed_loop() -> None:
            todo = deque(zip(bodies, records))

            async def user() -> None:
                while todo:
                    body, rec = todo.popleft()
                    rec.scheduled_time = clock.now()
                    await send(body, rec)

            users = [asyncio.ensure_future(user()) for _ in range(concurrency)]
            tasks.extend(users)
            await asyncio.gather(*users, return_exceptions=True)

        main = asyncio.ensure_future(open_loop() if mode == "open" else closed_loop())
        cut = False
        try:
            await asyncio.wait_for(asyncio.shield(main), max_duration)
        except asyncio.TimeoutError:
            cut = True
            for t in tasks:
                t.cancel()
            main.cancel()
            await asyncio.gather(main, *tasks, return_exceptions=True)
            for rec in records:
                if rec.send_time is None:
                    rec.error = "not sent: the load's max_duration was reached"
        finally:
            bar.close()
        wall = clock.now()
    result = LoadResult(records, mode, url, model, concurrency, target_rate, wall,
                        meta={"endpoint": endpoint,
                              "max_duration": max_duration}, warmup=warm, cut=cut,
                        max_concurrency=max_concurrency if mode == "open" else None)
    for line in result.summary().splitlines():
        if line.startswith(("CUT:", "BEHIND PLAN:")):
            warnings.warn(line, stacklevel=2)
    return result


async def _warm_up(client: httpx.AsyncClient, path: str, bodies: list[dict], n: int,
                   tokenizer) -> list[ClientRecord]:
    """``n`` requests (the load's first bodies, in turn) sent together and awaited before the
    load."""
    if n == 0:
        return []
    clock = _Clock()
    records = [ClientRecord(f"warmup-{i}", -1, bodies[i % len(bodies)]["max_tokens"], 0.0)
               for i in range(n)]
    await asyncio.gather(*[_send(client, path, bodies[i % len(bodies)], rec, clock, tokenizer)
                           for i, rec in enumerate(records)])
    return records


def run_load(url: str, requests: list[LoadRequest], **kwargs) -> LoadResult:
    """``run_load_async`` from synchronous code, also inside Jupyter (which already runs a loop:
    then the load runs on a thread of its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_load_async(url, requests, **kwargs))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run_load_async(url, requests, **kwargs)).result()
