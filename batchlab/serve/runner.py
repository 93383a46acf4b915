"""The engine thread behind the server: one online engine, and a handle per HTTP request.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

from batchlab.engine import Engine
from batchlab.online import EngineInbox
from batchlab.requests import KVTransfer, Request, RequestStatus
from batchlab.serve.bridge import Bridge, ErrorEvent, Handle
from batchlab.serve.config import ServerConfig
from batchlab.serve.kv_connector import KVConnector, Received
from batchlab.serve.kv_transfer import TransferAsk
from batchlab.serve.engine_view import TraceWindow, end_state, read_engine_stats, run_online_bounded
from batchlab.serve.metrics import ServerMetrics
from batchlab.serve.protocol import APIError, GenerationRequest
from batchlab.serve.simulated import placeholder_token_id


def _transfer_timings(handle: Handle) -> dict | None:
    """The hand-off in a response's timings: the part played, and for the decode part the KV
    received."""
    if handle.transfer is None:
        return None
    got = handle.received
    return {"part": handle.transfer.part, "from": handle.transfer.url,
            "kv_tokens": handle.req.kv_transfer.tokens
            if handle.req.kv_transfer is not None else 0,
            "kv_bytes": None if got is None else got.meta["bytes"],
            "transfer_s": None if got is None else got.transfer_s,
            "recomputed": handle.transfer.part == "decode"
            and got is None}


class EngineRunner:
    """The real model served by one online engine in its own thread (see the module docstring)."""

    def __init__(self, config: ServerConfig, lm=None) -> None:
        if not isinstance(config, ServerConfig):
            raise ValueError(f"config={config!r}; must be a ServerConfig")
        from batchlab.model import load_model, load_tokenizer
        self.config = config
        self.device = config.device
        if self.device is None:
            self.lm = lm if lm is not None else load_model()
            self.tokenizer = self.lm.tokenizer
            self.backend = config.make_backend(self.lm)
        else:
            # no weights: the tokenizer, and a backend that predicts step times
            self.lm = None
            self.tokenizer = lm.tokenizer if lm is not None else load_tokenizer()
            self.backend = self.device.backend(config, placeholder_token_id(self.tokenizer))
        self.model_root = (config.model_root or getattr(self.tokenizer, "name_or_path", None)
                           or self.lm.name)
        self.scheduler = config.make_scheduler()
        self.streams = self.scheduler.streams_tokens
        self.engine = Engine(self.scheduler, self.backend, clock="wall")
        self.inbox = EngineInbox()
        self.handles: dict[str, Handle] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.trace = None
        self.error: str | None = None
        self.accepting = False
        self.shutdown_reason: str | None = None
        self.num_accepted = 0
        self.num_refused = 0
        self.started_unix = time.time()
        self._clock_unix_offset: float | None = None   # unix time = engine time + this (read once)
        self.window = TraceWindow(config.trace_window)
        spec = config.speculative_config
        self.metrics = ServerMetrics(config.model_name, config.engine.max_model_len,
                                     lambda: read_engine_stats(self.scheduler, self.backend.kv),
                                     spec.num_speculative_tokens if spec else 0)
        self.connector = None if config.kv_transfer_config is None else self._connector(config)

    def _connector(self, config: ServerConfig) -> KVConnector:
        """The KV hand-off of disaggregated serving, with this server's cache as a peer must match
        it."""
        transfer = config.kv_transfer_config
        if self.device is None:
            kv = self.backend.kv
            cache = {"kv_shape": [kv.num_layers, kv.num_kv_heads, kv.head_dim],
                     "dtype": str(kv.kv.dtype)[6:], "simulated": None}
            per_token = kv.bytes_per_token
        else:
            shape, nbytes = self.device.shape, self.device.dtype_bytes
            cache = {"kv_shape": [shape.num_layers, shape.num_kv_heads, shape.head_dim],
                     "dtype": f"{nbytes}-byte", "simulated": shape.name}
            per_token = shape.kv_bytes_per_token(nbytes)
        return KVConnector(transfer, {**cache, "block_size": config.engine.block_size}, per_token)

    # --- life -------------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the engine thread; events are delivered on ``loop``."""
        self.loop = loop
        self.thread = threading.Thread(target=self._run, name="batchlab-engine", daemon=True)
        self.thread.start()
        self.accepting = True

    def _run(self) -> None:
        try:
            self.trace = run_online_bounded(self.engine, self.inbox, Bridge(self), self.window)
        except Exception as e:   # the engine broke its contract: say so to every waiting client
            self.error = f"engine failed: {type(e).__name__}: {e}"
            self.accepting = False
            for rid in list(self.handles):
                handle = self.handles.pop(rid, None)
                if handle is not None:
                    self.metrics.failed(1)          # request_success{finished_reason="error"}
                if handle is not None and self.loop is not None:
                    try:
                        self.loop.call_soon_threadsafe(handle.events.put_nowait,
                                                       ErrorEvent(self.error))
                    except RuntimeError:
                        pass

    @property
    def healthy(self) -> bool:
        return self.error is None and self.thread is not None and self.thread.is_alive()

    def shutdown(self, reason: str) -> None:
        """Stop admission, end every request in flight with ``reason``, end the engine thread."""
        self.accepting = False
        if self.shutdown_reason is None:
            self.shutdown_reason = reason
        self.inbox.stop(reason)

    def join(self, timeout: float = 30.0) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    def release_memory(self) -> None:
        """Once the engine thread has ended, drop what holds memory (weights, KV cache; the trace
        stays): an app's route functions outlive their server in FastAPI's caches, holding this
        runner."""
        if self.thread is not None and self.thread.is_alive():
            raise RuntimeError("release_memory() while the engine thread runs; shut down and "
                               "join it first")
        self.engine = self.backend = self.scheduler = self.lm = self.window.engine = None

    # --- requests ---------------------------------------------------------------------------------
    def num_waiting(self) -> int:
        """Accepted requests not admitted yet (the engine writes statuses; reading one is safe)."""
        return sum(1 for h in list(self.handles.values()) if h.req.status is RequestStatus.WAITING)

    def submit(self, gen: GenerationRequest, received_unix: float | None = None,
               x_request_id: str | None = None, transfer: TransferAsk | None = None,
               received: Received | None = None) -> Handle:
        """Hand ``gen`` to the engine, or refuse it: 503 (not running), 429 (queue full), 400.
        ``received_unix``: when the HTTP handler started on it (before parsing). The engine's
        request id is always fresh; the client's ``x_request_id`` travels beside it.
        ``transfer``: the part of disaggregated serving it is (the prefill part keeps its KV for
        export); ``received``: the decode part's KV, pulled from the prefill worker."""
        self._admit_or_refuse(gen)
        req = self._engine_request(gen, transfer, received)
        reason = self.scheduler.why_unschedulable(req)
        if reason is not None:
            raise APIError(400, f"this server can never run this request: {reason}",
                           "messages" if gen.kind == "chat" else "prompt")
        handle = Handle(req.request_id, gen, req,
                        time.time() if received_unix is None else received_unix,
                        x_request_id, transfer=transfer, received=received)
        self.handles[req.request_id] = handle
        try:
            self.inbox.add(req)
        except RuntimeError:
            self.handles.pop(req.request_id, None)
            raise APIError(503, "not accepting requests: the server is shutting down", None,
                           "service_unavailable") from None
        self.num_accepted += 1
        return handle

    def _admit_or_refuse(self, gen: GenerationRequest) -> None:
        """503 when not accepting, 429 when ``max_waiting`` requests wait, 400 for what a simulated
        server cannot give."""
        if not self.accepting:
            why = self.error or (f"the server is shutting down ({self.shutdown_reason})"
                                 if self.shutdown_reason else "the engine is not running")
            raise APIError(503, f"not accepting requests: {why}", None, "service_unavailable")
        if self.num_waiting() >= self.config.max_waiting:
            self.num_refused += 1
            self.metrics.refused()
            raise APIError(429,
                           f"{self.config.max_waiting} requests are already waiting for admission "
                                f"(--max-waiting {self.config.max_waiting}); retry later", None,
                           "rate_limit_exceeded", headers={"Retry-After": "1"})
        if self.config.simulate and gen.sampling.logprobs is not None:
            raise APIError(400, "logprobs: a simulated server draws placeholder tokens, not the "
                                "model's, so it has no log-probabilities; ask a server that runs "
                                "the model",
                                "logprobs")

    def _engine_request(self, gen: GenerationRequest, transfer: TransferAsk | None,
                        received: Received | None) -> Request:
        """The engine's request for ``gen``: a fresh id, the end-of-sequence token among its stops
        (unless ``ignore_eos``), and its part in a KV hand-off."""
        eos = (() if gen.ignore_eos or self.tokenizer.eos_token_id is None
               else (self.tokenizer.eos_token_id,))
        stop_ids = tuple(dict.fromkeys(eos + tuple(gen.stop_token_ids)))
        prefix = "cmpl" if gen.kind == "completion" else "chatcmpl"
        # KV received: all but the last token's
        n = len(gen.prompt_ids) - 1 if received is not None else 0
        kv = (KVTransfer(n, received.kv, received.transfer_s if self.device is not None else 0.0)
              if n else None)
        return Request(f"{prefix}-{uuid.uuid4().hex[:24]}", gen.prompt_ids, gen.max_tokens, 0.0,
                       gen.sampling, stop_token_ids=stop_ids, kv_transfer=kv,
                       kv_export=transfer is not None and transfer.part == "prefill")

    def abort(self, request_id: str, reason: str) -> None:
        self.inbox.abort(request_id, reason)

    def stop_string_matched(self, handle: Handle) -> None:
        """The handler's detokenizer found a stop string: the request ends with "stop"."""
        handle.stop_string_matched = True
        self.abort(handle.request_id, "stop string matched")

    # --- reporting --------------------------------------------------------------------------------
    def _unix_offset(self) -> float:
        """Unix time minus engine time, read once: every response then places the same step's end
        at the same instant (two clock reads per response would differ by microseconds)."""
        if self._clock_unix_offset is None:
            self._clock_unix_offset = time.time() - self.engine.clock.now()
        return self._clock_unix_offset

    def timings(self, handle: Handle, req: Request, release: float) -> dict:
        """The server's own times for one request (engine clock, seconds), for the extension field,
        and how it ended (the one place the runner reads a request's end state)."""
        end = end_state(req)
        arrival, first = req.arrival_time, req.first_scheduled_time
        first_token = req.token_times[0] if req.token_times else None
        if not self.streams and req.token_times:
            first_token = release               # handed back whole at release
        return {
            "request_id": req.request_id,
            "x_request_id": handle.x_request_id,
            "received_unix": handle.received_unix,
            "engine_clock_unix_offset": self._unix_offset(),
            "arrival_time": arrival,
            "first_scheduled_time": first,
            "first_token_time": first_token,
            "finish_time": req.token_times[-1] if req.token_times else None,
            "release_time": release,
            "queue_s": None if first is None else first - arrival,
            "ttft_s": None if first_token is None else first_token - arrival,
            "token_times": list(req.token_times),
            "token_ids": list(req.output_ids),
            "status": end.status,
            # (an abort of ours)
            "finish_reason": "stop" if handle.stop_string_matched else end.finish_reason,
            "finish_detail": end.detail,
            "policy": self.config.policy,
            "simulated": self.config.simulate,
            "kv_transfer": _transfer_timings(handle),
        }

    def stats(self) -> dict:
        kv = self.backend.kv
        return {"healthy": self.healthy, "accepting": self.accepting, "error": self.error,
                "policy": self.config.policy, "scheduler": repr(self.scheduler),
                "in_flight": len(self.handles), "waiting": self.num_waiting(),
                "accepted": self.num_accepted, "refused_429": self.num_refused,
                "kv_used_tokens": kv.used_tokens, "kv_capacity_tokens": kv.capacity_tokens,
                "max_model_len": self.config.engine.max_model_len,
                "trace_window": self.config.trace_window,
                "trace_forgotten": self.window.num_forgotten, "simulated": self.config.simulate,
                "kv_exports_held": None if self.connector is None else len(self.connector.exports),
                "kv_exports_expired": (None if self.connector is None
                                       else self.connector.exports.num_expired)}
