"""The HTTP side: a FastAPI app with OpenAI-compatible routes over an ``EngineRunner``.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (``"stream": true`` for server-sent
events), ``GET /v1/models``, ``GET /health``, and ``GET /batchlab/stats`` (queue and KV-cache
occupancy, for tests and notebooks). With an API key, every ``/v1`` route needs
``Authorization: Bearer <key>`` and answers 401 without it (``/health`` stays open, as in vLLM).

Each response carries the server's own timings for the request in an extension field,
``"batchlab"`` (in the last chunk when streaming): arrival, first scheduled, first token, finish
and release on the engine's clock, with ``engine_clock_unix_offset`` to put them on the client's
clock. A client can then split its TTFT into network and HTTP + queueing + prefill.

A client that disconnects has its request aborted ("aborted: client disconnected"); its KV space
is freed before the engine's next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from batchlab.serve.protocol import APIError, GenerationRequest, chunk_body, parse_generation, parse_json, response_body, sse, usage
from batchlab.serve.runner import EngineRunner

KEEPALIVE_S = 1.0     # an SSE comment line after this long without an event (detects gone clients)
FINISH_REASONS = {"length": "length", "stop": "stop"}


class Detokenizer:
    """Token ids → text deltas, with stop strings (cut before the match, never sent in part)."""

    def __init__(self, tokenizer, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1   # chars that may start a stop string
        self.ids: list[int] = []
        self.sent = 0              # characters already handed out
        self.stopped = False

    def add(self, token: int) -> str:
        """The text that can be sent now that ``token`` is known; sets ``stopped`` on a stop string."""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if self.stop:
            hits = [i for i in (text.find(s, max(0, self.sent - len(s))) for s in self.stop) if i >= 0]
            if hits:
                self.stopped = True
                return self._emit(text[:min(hits)])
        if text.endswith("\ufffd"):            # a character split across tokens: wait for the rest
            return ""
        return self._emit(text[:len(text) - self.hold] if self.hold else text)

    def flush(self) -> str:
        """At the end: whatever was held back."""
        if self.stopped:
            return ""
        return self._emit(self.tokenizer.decode(self.ids, skip_special_tokens=True))

    def _emit(self, upto: str) -> str:
        delta = upto[self.sent:]
        self.sent = max(self.sent, len(upto))
        return delta


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def build_app(runner: EngineRunner, api_key: str | None = None) -> FastAPI:
    """The app; the runner's engine thread starts with the app's lifespan and stops with it."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        runner.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            runner.shutdown("server stopped")
            await asyncio.get_running_loop().run_in_executor(None, runner.join)

    app = FastAPI(title="batchlab", lifespan=lifespan)
    app.state.runner = runner

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return _error(e)

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if api_key is not None and request.url.path.startswith("/v1"):
            if request.headers.get("authorization", "") != f"Bearer {api_key}":
                return _error(APIError(401, "a valid API key is required: send the header "
                                            "'Authorization: Bearer <key>'", None, "authentication_error"))
        return await call_next(request)

    @app.get("/health")
    async def health():
        if runner.healthy:
            return Response(status_code=200)
        return JSONResponse({"error": runner.error or "the engine is not running"}, status_code=503)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": runner.config.model_name, "object": "model", "created": 0, "owned_by": "batchlab",
            "max_model_len": runner.config.max_model_len}]}

    @app.get("/batchlab/stats")
    async def stats():
        return runner.stats()

    async def generate(request: Request, kind: str):
        received = time.time()
        body = parse_json(await request.body())
        gen = parse_generation(body, kind, served_model=runner.config.model_name, tokenizer=runner.tokenizer,
                               max_model_len=runner.config.max_model_len)
        handle = runner.submit(gen, received)
        if gen.stream:
            return StreamingResponse(_stream(runner, handle), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _whole(runner, handle, request)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, "chat")

    return app


def _api_finish_reason(status: str, reason: str | None, detok: Detokenizer) -> str:
    if detok.stopped:
        return "stop"
    if status == "finished":
        return FINISH_REASONS.get(reason or "", "stop")
    return "abort"


async def _stream(runner: EngineRunner, handle) -> AsyncIterator[bytes]:
    """The SSE body: a chunk per visible token (text may be held back), the last one with the
    finish reason and the server's timings, usage if asked, then ``[DONE]``."""
    gen: GenerationRequest = handle.gen
    detok = Detokenizer(runner.tokenizer, gen.stop)
    ended = False
    first = True
    num_tokens = 0
    try:
        while True:
            try:
                event = await asyncio.wait_for(handle.events.get(), KEEPALIVE_S)
            except asyncio.TimeoutError:
                yield b": keepalive\n\n"
                continue
            if event[0] == "token":
                num_tokens += 1
                if detok.stopped:
                    continue                     # the abort is on its way
                delta = detok.add(event[1])
                if detok.stopped:
                    runner.abort(handle.request_id, "stop string matched")
                chunk = chunk_body(gen, handle.request_id, delta, first=first)
                first = False
                if gen.continuous_usage:
                    chunk["usage"] = usage(len(gen.prompt_ids), num_tokens)
                yield sse(chunk)
                continue
            ended = True
            if event[0] == "error":
                yield sse({"error": {"message": event[1], "type": "server_error", "param": None, "code": 500}})
                yield sse("[DONE]")
                return
            _, status, reason, timings, tokens = event
            text = ""
            if tokens is not None:               # handed back whole at release
                for t in tokens:
                    text += detok.add(t)
                    if detok.stopped:
                        break
                num_tokens = len(tokens)
            text += detok.flush()
            if detok.stopped:
                num_tokens = min(num_tokens, len(detok.ids))
            finish = _api_finish_reason(status, reason, detok)
            chunk = chunk_body(gen, handle.request_id, text, finish, first=first)
            chunk["batchlab"] = timings
            if gen.continuous_usage:
                chunk["usage"] = usage(len(gen.prompt_ids), num_tokens)
            yield sse(chunk)
            if gen.include_usage:
                last = chunk_body(gen, handle.request_id, None)
                last["usage"] = usage(len(gen.prompt_ids), num_tokens)
                yield sse(last)
            yield sse("[DONE]")
            return
    finally:
        if not ended:                            # the client went away (or the stream was cancelled)
            runner.abort(handle.request_id, "client disconnected")


async def _whole(runner: EngineRunner, handle, request: Request) -> JSONResponse:
    """Wait for the end (aborting if the client disconnects), then answer the whole response."""
    gen: GenerationRequest = handle.gen
    detok = Detokenizer(runner.tokenizer, gen.stop)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    num_tokens = 0
    try:
        while True:
            getter = asyncio.ensure_future(handle.events.get())
            done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                runner.abort(handle.request_id, "client disconnected")
                return JSONResponse({}, status_code=499)   # nobody reads it
            event = getter.result()
            if event[0] == "token":
                num_tokens += 1
                if not detok.stopped:
                    detok.add(event[1])
                    if detok.stopped:
                        runner.abort(handle.request_id, "stop string matched")
                continue
            if event[0] == "error":
                return _error(APIError(500, event[1], None, "server_error"))
            _, status, reason, timings, tokens = event
            if tokens is not None:
                for t in tokens:
                    detok.add(t)
                    if detok.stopped:
                        break
                num_tokens = len(tokens)
            detok.flush()
            if detok.stopped:
                num_tokens = min(num_tokens, len(detok.ids))
            finish = _api_finish_reason(status, reason, detok)
            if finish == "abort":                # e.g. the server is shutting down
                return _error(APIError(503, f"the request was ended after {num_tokens} tokens: {reason}",
                                       None, "service_unavailable"))
            text = runner.tokenizer.decode(detok.ids, skip_special_tokens=True)[:detok.sent] \
                if detok.stopped else runner.tokenizer.decode(detok.ids, skip_special_tokens=True)
            return JSONResponse(response_body(gen, handle.request_id, text, finish, num_tokens, timings))
    finally:
        watcher.cancel()
