"""One response, built as its request's events arrive: the text so far (stop strings held back,
echo, log-probabilities), then either a stream of server-sent events (``stream_events``) or one
whole JSON answer (``whole_response``). A client that goes away has its request aborted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from batchlab.serve.bridge import EndEvent, ErrorEvent, Event, Handle, TokenEvent
from batchlab.serve.detok import Detokenizer
from batchlab.serve.protocol import APIError, GenerationRequest
from batchlab.serve.responses import (chat_logprobs, chunk_body, completion_logprobs,
                                      error_response, response_body, sse, usage)
from batchlab.serve.runner import EngineRunner

LOG = logging.getLogger("batchlab.serve")
KEEPALIVE_S = 1.0     # an SSE comment line after this long without an event (detects gone clients)


class ResponseText:
    """One response's text and token count as events arrive (shared by streamed and whole
    answers)."""

    def __init__(self, runner: EngineRunner, handle: Handle) -> None:
        gen = handle.gen
        self.runner, self.handle = runner, handle
        self.detok = Detokenizer(runner.tokenizer, gen.stop, gen.include_stop,
                                 gen.skip_special_tokens, gen.stop_token_ids,
                                 gen.sampling.min_tokens)
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


async def stream_events(runner: EngineRunner, handle: Handle) -> AsyncIterator[bytes]:
    """The SSE body: a chunk per batch of tokens that arrived together (text may be held back),
    the last with the finish reason and the server's timings, usage if asked, then ``[DONE]``."""
    gen, out, rid = handle.gen, ResponseText(runner, handle), _response_id(handle)
    first, ended = True, False
    try:
        while True:
            try:
                event = await asyncio.wait_for(handle.events.get(), KEEPALIVE_S)
            except asyncio.TimeoutError:
                yield b": keepalive\n\n"
                continue
            events = await _arrived_together(handle, event)
            last = events[-1]
            if isinstance(last, ErrorEvent):
                ended = True
                yield sse({"error": {"message": last.message, "type": "server_error",
                                     "param": None, "code": 500}})
                yield sse("[DONE]")
                return
            text = out.take([t for e in events if isinstance(e, TokenEvent) for t in e.token_ids])
            if isinstance(last, EndEvent):
                ended = True
                for piece in _last_chunks(gen, rid, out, text, last, first):
                    yield piece
                return
            chunk = chunk_body(gen, rid, text, first=first, logprobs=out.logprobs())
            first = False
            if gen.continuous_usage:
                chunk["usage"] = usage(len(gen.prompt_ids), out.num_tokens)
            yield sse(chunk)
    finally:
        # the client went away (or the stream was cancelled)
        if not ended:
            runner.abort(handle.request_id, "client disconnected")


def _last_chunks(gen: GenerationRequest, rid: str, out: ResponseText, text: str, end: EndEvent,
                 first: bool) -> list[bytes]:
    """The stream's end: the last chunk (its finish reason and the server's timings), usage if
    asked, then ``[DONE]``."""
    more, finish = out.finish(end.timings, end.token_ids)
    chunk = chunk_body(gen, rid, text + more, finish, first=first, logprobs=out.logprobs())
    chunk["batchlab"] = end.timings
    if gen.continuous_usage:
        chunk["usage"] = usage(len(gen.prompt_ids), out.num_tokens)
    pieces = [sse(chunk)]
    if gen.include_usage:
        tail = chunk_body(gen, rid, None)
        tail["usage"] = usage(len(gen.prompt_ids), out.num_tokens)
        pieces.append(sse(tail))
    return pieces + [sse("[DONE]")]


async def whole_response(runner: EngineRunner, handle: Handle, request: Request) -> JSONResponse:
    """Wait for the end (aborting if the client disconnects), then answer the whole response."""
    out = ResponseText(runner, handle)
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
                return error_response(APIError(500, event.message, None, "server_error"))
            return _whole_answer(runner, handle, request, out, "".join(parts), event)
    finally:
        watcher.cancel()


def _whole_answer(runner: EngineRunner, handle: Handle, request: Request, out: ResponseText,
                  text: str, event: EndEvent) -> JSONResponse:
    """The whole response once its request has ended (a 503 if it was aborted)."""
    timings = event.timings
    more, finish = out.finish(timings, event.token_ids)
    if finish == "abort":                # e.g. the server is shutting down
        LOG.warning("request %s ended after %d tokens: %s", handle.request_id,
                    out.num_tokens, timings["finish_detail"])
        return error_response(APIError(
            503, f"the request was ended after {out.num_tokens} tokens: "
                 f"{timings['finish_detail']}", None, "service_unavailable"))
    body = response_body(handle.gen, _response_id(handle), text + more, finish,
                         out.num_tokens, timings, out.logprobs())
    # where the decode part pulls
    if handle.transfer is not None and handle.transfer.part == "prefill":
        host, port = request.scope.get("server") or ("127.0.0.1", 0)
        body["kv_transfer_params"] = runner.connector.params_for_decode(handle.request_id,
                                                                        host, port)
    return JSONResponse(body)


__all__ = ["ResponseText", "stream_events", "whole_response"]
