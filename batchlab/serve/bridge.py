"""The engine thread's side of a request: a step's outputs become typed events on the request's
asyncio queue (``Bridge``), which its HTTP handler reads (``Handle``), and ``/metrics`` is fed on
the way. Nothing here reads the engine's insides: a step's output and a request's end say it all."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from batchlab.listener import EngineListener, RequestOutput, StepOutput
from batchlab.requests import KVCopy, Request
from batchlab.serve.kv_connector import Received
from batchlab.serve.kv_transfer import TransferAsk
from batchlab.serve.protocol import GenerationRequest


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One engine step's new tokens for a request; ``finished``: the last of them ended it (its
    ``EndEvent`` follows from the same step)."""

    token_ids: list[int]
    finished: bool = False


@dataclass(frozen=True, slots=True)
class EndEvent:
    """The request's response is complete. ``timings``: the server's times and how it ended
    (``EngineRunner.timings``); ``token_ids``: the whole output when the policy hands it back at
    the end (a request-level batcher), else None (it was streamed in ``TokenEvent``s)."""

    timings: dict
    token_ids: list[int] | None


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """The engine failed; the request will get nothing more."""

    message: str


Event = TokenEvent | EndEvent | ErrorEvent


@dataclass
class Handle:
    """One accepted request, as its HTTP handler sees it: ``events`` brings ``TokenEvent``s as
    tokens become visible, then exactly one ``EndEvent``, or an ``ErrorEvent`` if the engine
    failed."""

    request_id: str
    gen: GenerationRequest
    req: Request
    received_unix: float
    x_request_id: str | None = None          # the client's X-Request-Id, echoed back
    stop_string_matched: bool = False        # set by the handler before it aborts the request
    transfer: TransferAsk | None = None      # disaggregated serving: the part this server plays
    received: Received | None = None         # the decode part: the KV it pulled
    events: asyncio.Queue = field(default_factory=asyncio.Queue)


class Bridge(EngineListener):
    """Engine thread -> event loop: each step's outputs become events on their handles' asyncio
    queues, and the metrics are fed on the way."""

    def __init__(self, runner: "EngineRunner") -> None:
        self.runner = runner
        # request id -> prompt tokens it did not compute, until it ends
        self.cached: dict[str, int] = {}

    def _post(self, request_id: str, event: Event) -> None:
        handle = self.runner.handles.get(request_id)
        if handle is None:
            return
        try:
            self.runner.loop.call_soon_threadsafe(handle.events.put_nowait, event)
        except RuntimeError:       # the event loop has closed: nobody is listening any more
            pass

    def on_step(self, out: StepOutput) -> None:
        runner = self.runner
        metrics, prefix_caching = runner.metrics, runner.config.engine.enable_prefix_caching
        metrics.step(out.step.num_tokens)                      # vllm:iteration_tokens_total
        for p in out.preempted:
            handle = runner.handles.get(p.request_id)
            metrics.preempted((handle.req.prompt_len if handle else 0) + p.num_output_tokens,
                              prefix_caching)
        for o in out.outputs:
            if o.num_cached_tokens is not None:
                self.cached[o.request_id] = o.num_cached_tokens
            if o.new_token_ids:
                self._tokens(o, out.step.end)

    def _tokens(self, o: RequestOutput, t: float) -> None:
        """One step's tokens of a request (several: a checked draft), counted as vLLM counts a
        step's output (one inter-token gap), and posted as one event, so a stream sends one
        chunk."""
        runner, req, tokens = self.runner, o.req, o.new_token_ids
        start = self.cached.get(req.request_id, 0)         # where its first chunk started
        external = start if req.kv_transfer is not None and start == req.kv_transfer.tokens else 0
        times = req.token_times
        previous = times[-len(tokens) - 1] if len(times) > len(tokens) else None
        runner.metrics.token(req.prompt_len, req.arrival_time, t, previous, runner.streams,
                             runner.config.engine.enable_prefix_caching, start - external, external,
                             len(tokens))
        if o.spec is not None:
            runner.metrics.checked(*o.spec)
        if runner.streams:
            self._post(req.request_id, TokenEvent(list(tokens), o.finish_reason is not None))

    def on_kv_export(self, req: Request, kv: KVCopy) -> None:
        # a prefill part finished: its KV waits for the decode part
        self.runner.connector.export(kv, req)

    def on_end(self, req: Request, t: float) -> None:
        runner = self.runner
        self.cached.pop(req.request_id, None)
        handle = runner.handles.get(req.request_id)
        if handle is not None:
            timings = runner.timings(handle, req, t)
            runner.metrics.finished(timings["finish_reason"], timings, req.prompt_len,
                                    req.max_new_tokens, runner.streams)
            self._post(req.request_id,
                       EndEvent(timings, None if runner.streams else list(req.output_ids)))
            runner.handles.pop(req.request_id, None)
        runner.window.note_end()
