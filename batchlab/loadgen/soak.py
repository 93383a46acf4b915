"""A soak load: many short, mixed requests against a running server, every answer checked.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from dataclasses import dataclass, field

import httpx

from batchlab.checks import check_int
from batchlab.loadgen.client import KEEPALIVE_S

KINDS = ("stream", "whole", "chat", "disconnect", "bad")
WEIGHTS = (0.55, 0.15, 0.10, 0.12, 0.08)
BAD_BODIES = ({"prompt": "x", "max_tokens": 0}, {"prompt": "x", "logprobs": 21}, {"prompt": 7},
              {"prompt": "x", "top_k": -2}, {"messages": "hi"})
WORDS = ("river", "mountain", "garden", "engine", "violin", "market", "winter", "planet", "lantern",
         "harbor")


@dataclass
class SoakReport:
    """What a soak saw: outcomes by kind, and the failures (kind, reason)."""

    num_requests: int = 0
    outcomes: Counter = field(default_factory=Counter)     # ("stream", "ok"), ("bad", "400"), ...
    failures: list[tuple[str, str]] = field(default_factory=list)

    @property
    def num_accepted(self) -> int:
        return sum(n for (kind, outcome), n in self.outcomes.items()
                   if outcome in ("ok", "disconnected"))


def _body(kind: str, rng: random.Random) -> dict:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
    n = rng.randint(1, 4)
    if kind == "bad":
        return dict(rng.choice(BAD_BODIES))
    if kind == "chat":
        return {"messages": [{"role": "user", "content": words}], "max_tokens": n, "temperature": 0,
                "stream": True}
    body = {"prompt": words, "max_tokens": 32 if kind == "disconnect" else n, "ignore_eos": True,
            "temperature": rng.choice((0, 0.8))}
    body["stream"] = kind != "whole"
    return body


async def _one(client: httpx.AsyncClient, kind: str, body: dict) -> str:
    """The outcome: "ok", "disconnected", "400" for a refused bad request; else raises with why."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    if not body.get("stream"):
        r = await client.post(path, json=body)
        if kind == "bad":
            if r.status_code != 400 or "error" not in r.json():
                raise AssertionError(f"a bad request got HTTP {r.status_code}: {r.text[:200]}")
            return "400"
        if r.status_code != 200 or not r.json()["choices"][0]["finish_reason"]:
            raise AssertionError(f"HTTP {r.status_code}: {r.text[:200]}")
        return "ok"
    finish, done = None, False
    async with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            raise AssertionError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise AssertionError(f"an error in the stream: {chunk['error']}")
            if kind == "disconnect":
                return "disconnected"          # leaving the block closes the connection mid-stream
            for choice in chunk["choices"]:
                finish = choice["finish_reason"] or finish
    if not done or finish not in ("length", "stop"):
        raise AssertionError("the stream ended without [DONE] after a finish reason "
                             f"(finish={finish!r})")
    return "ok"


async def soak_async(url: str, n: int, concurrency: int = 16, seed: int = 0, timeout: float = 120.0,
                     on_progress=None) -> SoakReport:
    """Send ``n`` mixed requests with ``concurrency`` workers; ``on_progress(done)`` after each."""
    check_int("n", n)
    check_int("concurrency", concurrency)
    rng = random.Random(seed)
    plan = [(kind, _body(kind, rng)) for kind in rng.choices(KINDS, WEIGHTS, k=n)]
    report = SoakReport(n)
    todo = iter(plan)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency,
                          keepalive_expiry=KEEPALIVE_S)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        async def worker() -> None:
            for kind, body in todo:
                try:
                    report.outcomes[(kind, await _one(client, kind, body))] += 1
                except Exception as e:           # recorded, never the soak's crash
                    report.failures.append((kind, f"{type(e).__name__}: {e}"))
                if on_progress is not None:
                    on_progress(sum(report.outcomes.values()) + len(report.failures))

        await asyncio.gather(*[worker() for _ in range(concurrency)])
    return report


def soak(url: str, n: int, concurrency: int = 16, seed: int = 0, timeout: float = 120.0,
         on_progress=None) -> SoakReport:
    """``soak_async`` from synchronous code."""
    return asyncio.run(soak_async(url, n, concurrency, seed, timeout, on_progress))
