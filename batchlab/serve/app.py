"""The HTTP side: a FastAPI app with OpenAI-compatible routes over an ``EngineRunner``.

Routes (as vLLM's OpenAI server names them): ``POST /v1/completions``, ``POST
/v1/chat/completions`` (``"stream": true`` for server-sent events), ``GET /v1/models``,
``GET /health``, ``GET /metrics`` (Prometheus text, vLLM's metric names: see ``metrics.py``),
``POST /tokenize``, ``POST /detokenize``, ``GET /version``, ``GET|POST /ping`` and ``GET /load``
(vLLM's), ``GET /get_load`` (what ``vllm-router`` polls under
``power_of_two``: ``{"load": requests in flight}``, the SGLang worker's form), and ``GET
/batchlab/stats`` (queue and KV-cache occupancy, for tests and notebooks). With an API key, every ``/v1`` route needs
``Authorization: Bearer <key>`` and answers 401 without it (the others stay open, as in vLLM).
Every error, ``/health``'s 503 included, is an OpenAI error object:
``{"error": {"message", "type", "param", "code"}}``.

Each response carries the server's own timings for the request in an extension field,
``"batchlab"`` (in the last chunk when streaming): arrival, first scheduled, first token, finish
and release on the engine's clock, with ``engine_clock_unix_offset`` to put them on the client's
clock. A client can then split its TTFT into network and HTTP + queueing + prefill.

``X-Request-Id``: a client's request header is echoed in the response's header, in the response
``id`` (``cmpl-<id>``, ``chatcmpl-<id>``) and in the timings (``x_request_id``); the engine's
own request id stays unique whatever clients send.

Streaming: tokens that reach the handler together (one step's, or several when the event loop
was busy) go out in one chunk, and the finish reason rides on the chunk of the last token, as in
vLLM. A client that disconnects has its request aborted ("client disconnected"); its KV space is
freed before the engine's next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request

import batchlab
from fastapi.responses import JSONResponse, Response, StreamingResponse

from batchlab.serve.detok import Detokenizer
from batchlab.serve.memory import TRIM_INTERVAL_S, release_free_memory
from batchlab.serve.metrics import CONTENT_TYPE
from batchlab.serve.protocol import (APIError, GenerationRequest, chat_logprobs, chunk_body, completion_logprobs,
                                     parse_detokenize, parse_generation, parse_json, parse_tokenize, response_body,
                                     sse, usage)
from batchlab.serve.kv_transfer import META_HEADER, Export, Received, TransferAsk
from batchlab.serve.bridge import EndEvent, ErrorEvent, Event, Handle, TokenEvent
from batchlab.serve.runner import EngineRunner

LOG = logging.getLogger("batchlab.serve")
KEEPALIVE_S = 1.0     # an SSE comment line after this long without an event (detects gone clients)
MAX_REQUEST_ID_CHARS = 256


def _permission(created: int) -> dict:
    """vLLM's ``ModelPermission`` card (clients that read ``permission`` find its fields)."""
    return {"id": f"modelperm-{created}", "object": "model_permission", "created": created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
            "group": None, "is_blocking": False}


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


class ProtocolMiddleware:
    """Plain ASGI (no per-chunk overhead on streams): the API key on ``/v1`` routes, and the
    client's ``X-Request-Id`` echoed in the response headers."""

    def __init__(self, app, api_key: str | None) -> None:
        self.app, self.api_key = app, api_key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.api_key is not None and scope["path"].startswith("/v1") \
                and headers.get(b"authorization", b"").decode(errors="replace") != f"Bearer {self.api_key}":
            response = _error(APIError(401, "a valid API key is required: send the header "
                                            "'Authorization: Bearer <key>'", None, "authentication_error"))
            return await response(scope, receive, send)
        request_id = headers.get(b"x-request-id")
        if request_id is None:
            return await self.app(scope, receive, send)

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + [(b"x-request-id", request_id)]
            await send(message)

        await self.app(scope, receive, send_with_id)


async def _release_memory_periodically() -> None:
    """Hand the allocator's free memory back to the system now and then (see ``memory.py``)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(TRIM_INTERVAL_S)
        if not await loop.run_in_executor(None, release_free_memory):
            return                               # no glibc here: nothing to trim


def client_request_id(request: Request) -> str | None:
    """The ``X-Request-Id`` header, checked (printable, at most 256 characters)."""
    value = request.headers.get("x-request-id")
    if value is None:
        return None
    if not value or len(value) > MAX_REQUEST_ID_CHARS or not value.isprintable():
        raise APIError(400, f"X-Request-Id={value[:60]!r}; must be 1 to {MAX_REQUEST_ID_CHARS} printable "
                            "characters", "X-Request-Id")
    return value


def build_app(runner: EngineRunner, api_key: str | None = None) -> FastAPI:
    """The app; the runner's engine thread starts with the app's lifespan and stops with it."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        loop = asyncio.get_running_loop()
        runner.start(loop)
        trimmer = asyncio.ensure_future(_release_memory_periodically())
        try:
            yield
        finally:
            trimmer.cancel()
            runner.shutdown("server stopped")
            await loop.run_in_executor(None, runner.join)
            if runner.connector is not None:
                await runner.connector.close()

    app = FastAPI(title="batchlab", lifespan=lifespan)
    app.state.runner = runner
    app.add_middleware(ProtocolMiddleware, api_key=api_key)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        # every refused request leaves a line in the log (at the default level, warning)
        LOG.warning("%s %s refused %d: %s", request.method, request.url.path, e.status, e.message)
        return _error(e)

    @app.get("/health")
    async def health():
        if runner.healthy:
            return Response(status_code=200)
        return _error(APIError(503, runner.error or "the engine is not running", None, "service_unavailable"))

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping():
        return await health()          # vLLM's /ping (the SageMaker route) answers as /health does

    @app.get("/version")
    async def version():
        return {"version": batchlab.__version__}

    @app.get("/load")
    async def load():
        return {"server_load": runner.stats()["in_flight"]}      # vLLM's name: requests in flight

    @app.get("/v1/models")
    async def models():
        created = int(runner.started_unix)
        return {"object": "list", "data": [{
            "id": runner.config.model_name, "object": "model", "created": created,
            "owned_by": "batchlab", "root": runner.model_root, "parent": None,
            "max_model_len": runner.config.max_model_len, "permission": [_permission(created)],
            "simulated_device": None if runner.device is None else runner.device.card()}]}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(runner.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        ids, with_strs = parse_tokenize(parse_json(await request.body()), served_model=runner.config.model_name,
                                        tokenizer=runner.tokenizer, root=runner.model_root)
        out = {"count": len(ids), "max_model_len": runner.config.max_model_len, "tokens": ids, "token_strs": None}
        if with_strs:
            out["token_strs"] = runner.tokenizer.convert_ids_to_tokens(ids)
        return out

    @app.post("/detokenize")
    async def detokenize(request: Request):
        ids = parse_detokenize(parse_json(await request.body()), served_model=runner.config.model_name,
                               tokenizer=runner.tokenizer, root=runner.model_root)
        return {"prompt": runner.tokenizer.decode(ids)}

    @app.get("/get_load")
    async def get_load():
        # vllm-router reads the integer "load" of each worker under its power_of_two policy only,
        # every --worker-startup-check-interval (30 s by default); the other fields are SGLang's names.
        stats = runner.stats()
        return {"load": stats["in_flight"], "num_reqs": stats["in_flight"] - stats["waiting"],
                "num_waiting_reqs": stats["waiting"], "num_tokens": stats["kv_used_tokens"]}

    @app.get("/batchlab/stats")
    async def stats():
        return runner.stats()

    @app.get("/batchlab/kv/{request_id}")
    async def kv_export(request_id: str):
        # disaggregated serving: a decode worker pulls a finished prefill's KV (read once)
        export = None if runner.connector is None else runner.connector.exports.take(request_id)
        if not isinstance(export, Export):
            raise APIError(404, export or "this server keeps no KV for others (no --kv-transfer-config)", None,
                           "not_found_error")
        return Response(export.data, media_type="application/octet-stream",
                        headers={META_HEADER: json.dumps(export.meta)})

    async def generate(request: Request, kind: str):
        received = time.time()
        x_request_id = client_request_id(request)
        body = parse_json(await request.body())
        gen = parse_generation(body, kind, served_model=runner.config.model_name, tokenizer=runner.tokenizer,
                               max_model_len=runner.config.max_model_len, root=runner.model_root)
        transfer, kv = await _hand_off(runner, gen)
        handle = runner.submit(gen, received, x_request_id, transfer, kv)
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


async def _hand_off(runner: EngineRunner, gen: GenerationRequest) -> tuple[TransferAsk | None, Received | None]:
    """Disaggregated serving (``kv_transfer.py``): the part this request asks this server to play,
    and for the decode part the KV pulled from the prefill worker before the request is admitted."""
    if gen.kv_transfer_params is None:
        return None, None
    if runner.connector is None:
        LOG.warning("kv_transfer_params ignored: this server has no --kv-transfer-config, so it computes the "
                    "whole prompt and keeps no KV for others")
        return None, None
    transfer = runner.connector.ask(gen.kv_transfer_params, gen.stream)
    if transfer is None or transfer.part == "prefill":
        return transfer, None
    return transfer, await runner.connector.receive(transfer, gen.prompt_ids)


# --- one response -------------------------------------------------------------------------------------
class _Output:
    """One response's text and token count as events arrive (shared by streamed and whole answers)."""

    def __init__(self, runner: EngineRunner, handle: Handle) -> None:
        gen = handle.gen
        self.runner, self.handle = runner, handle
        self.detok = Detokenizer(runner.tokenizer, gen.stop, gen.include_stop, gen.skip_special_tokens,
                                 gen.stop_token_ids, gen.sampling.min_tokens)
        self.echo = gen.echo_text or ""           # sent before the first piece of the answer
        self.logprobs_sent = 0                    # output tokens whose log-probabilities went out
        self.text_offset = 0                      # completions' text_offset of the next one

    def take(self, tokens: list[int]) -> str:
        """The text of newly arrived tokens (stop strings cut; the request ended on a match)."""
        detok = self.detok
        text = "".join(detok.add(t) for t in tokens)
        if detok.stopped and not self.handle.stop_string_matched:
            self.runner.stop_string_matched(self.handle)
        return self._with_echo(text)

    def finish(self, timings: dict, tokens: list[int] | None) -> tuple[str, str]:
        """(the last text, the API's finish reason) at the end event."""
        text = self.take(tokens) if tokens else ""
        text += self._with_echo(self.detok.flush())
        return text, "stop" if self.detok.stopped else timings["finish_reason"]

    @property
    def num_tokens(self) -> int:
        return self.detok.num_used if self.detok.stopped else self.detok.num_tokens

    def logprobs(self) -> dict | None:
        """The log-probabilities of the tokens used since the last call, in the response's form
        (None when the request did not ask). The engine stores a token's before announcing it."""
        gen = self.handle.gen
        num_top = gen.sampling.logprobs
        if num_top is None:
            return None
        entries = self.handle.req.output_logprobs[self.logprobs_sent:self.num_tokens]
        self.logprobs_sent += len(entries)
        decode = self.runner.tokenizer.decode
        if gen.kind == "chat":
            return chat_logprobs(entries, num_top, lambda t: decode([t]))
        out = completion_logprobs(entries, num_top, lambda t: decode([t]), self.text_offset)
        self.text_offset += sum(len(t) for t in out["tokens"])
        return out

    def _with_echo(self, text: str) -> str:
        if self.echo:
            text, self.echo = self.echo + text, ""
        return text


def _response_id(handle: Handle) -> str:
    if handle.x_request_id is None:
        return handle.request_id
    return ("cmpl-" if handle.gen.kind == "completion" else "chatcmpl-") + handle.x_request_id


async def _arrived_together(handle: Handle, event: Event) -> list[Event]:
    """``event`` and every event already queued behind it. The step whose tokens ended the request
    also ends it: its end is waited for, so the finish reason rides on the last token's chunk."""
    events = [event]
    while not handle.events.empty():
        events.append(handle.events.get_nowait())
    if isinstance(events[-1], TokenEvent) and events[-1].finished:
        events.append(await handle.events.get())
    return events


async def _stream(runner: EngineRunner, handle: Handle) -> AsyncIterator[bytes]:
    """The SSE body: a chunk per batch of tokens that arrived together (text may be held back),
    the last with the finish reason and the server's timings, usage if asked, then ``[DONE]``."""
    gen: GenerationRequest = handle.gen
    out = _Output(runner, handle)
    rid = _response_id(handle)
    first = True
    ended = False
    try:
        while True:
            try:
                event = await asyncio.wait_for(handle.events.get(), KEEPALIVE_S)
            except asyncio.TimeoutError:
                yield b": keepalive\n\n"
                continue
            events = await _arrived_together(handle, event)
            tokens = [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids]
            last = events[-1]
            if isinstance(last, ErrorEvent):
                ended = True
                yield sse({"error": {"message": last.message, "type": "server_error", "param": None, "code": 500}})
                yield sse("[DONE]")
                return
            text = out.take(tokens)
            if not isinstance(last, EndEvent):
                chunk = chunk_body(gen, rid, text, first=first, logprobs=out.logprobs())
                first = False
                if gen.continuous_usage:
                    chunk["usage"] = usage(len(gen.prompt_ids), out.num_tokens)
                yield sse(chunk)
                continue
            ended = True
            timings = last.timings
            more, finish = out.finish(timings, last.token_ids)
            chunk = chunk_body(gen, rid, text + more, finish, first=first, logprobs=out.logprobs())
            chunk["batchlab"] = timings
            if gen.continuous_usage:
                chunk["usage"] = usage(len(gen.prompt_ids), out.num_tokens)
            yield sse(chunk)
            if gen.include_usage:
                tail = chunk_body(gen, rid, None)
                tail["usage"] = usage(len(gen.prompt_ids), out.num_tokens)
                yield sse(tail)
            yield sse("[DONE]")
            return
    finally:
        if not ended:                            # the client went away (or the stream was cancelled)
            runner.abort(handle.request_id, "client disconnected")


async def _whole(runner: EngineRunner, handle: Handle, request: Request) -> JSONResponse:
    """Wait for the end (aborting if the client disconnects), then answer the whole response."""
    gen: GenerationRequest = handle.gen
    out = _Output(runner, handle)
    parts: list[str] = []

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        while True:
            getter = asyncio.ensure_future(handle.events.get())
            done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                runner.abort(handle.request_id, "client disconnected")
                return JSONResponse({}, status_code=499)   # nobody reads it
            event = getter.result()
            if isinstance(event, TokenEvent):
                parts.append(out.take(event.token_ids))
                continue
            if isinstance(event, ErrorEvent):
                return _error(APIError(500, event.message, None, "server_error"))
            timings = event.timings
            more, finish = out.finish(timings, event.token_ids)
            if finish == "abort":                # e.g. the server is shutting down
                LOG.warning("request %s ended after %d tokens: %s", handle.request_id, out.num_tokens,
                            timings["finish_detail"])
                return _error(APIError(503, f"the request was ended after {out.num_tokens} tokens: "
                                            f"{timings['finish_detail']}", None, "service_unavailable"))
            body = response_body(gen, _response_id(handle), "".join(parts) + more, finish, out.num_tokens, timings,
                                 out.logprobs())
            if handle.transfer is not None and handle.transfer.part == "prefill":   # where the decode part pulls
                host, port = request.scope.get("server") or ("127.0.0.1", 0)
                body["kv_transfer_params"] = runner.connector.params_for_decode(handle.request_id, host, port)
            return JSONResponse(body)
    finally:
        watcher.cancel()


__all__ = ["build_app", "ProtocolMiddleware"]
