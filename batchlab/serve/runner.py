"""The engine thread behind the server: one online engine, and a handle per HTTP request.

``EngineRunner`` owns the real model, the KV cache, the scheduler (any of the three policies) and
an ``Engine`` on the wall clock running ``run_online`` in a thread of its own. HTTP handlers run on
the asyncio event loop; they never touch the engine directly:

    handler ── submit(gen) ──> EngineInbox.add ──> engine thread (top of its next loop pass)
    handler <── asyncio.Queue <── call_soon_threadsafe <── listener.on_token / on_end

Admission control happens here, before the inbox: a request is refused with 429 when
``max_waiting`` requests are already waiting for admission (arrived, not yet running), and with
503 once the server is shutting down. Refused requests never reach the engine; every accepted
request ends with an "end" event (finished, or aborted with the reason).

The bridge also feeds ``/metrics`` (``metrics.ServerMetrics``) as steps, tokens and ends happen, and a
``TraceWindow`` keeps the engine's trace to the last ``trace_window`` ended requests, so the
server's memory stays bounded however long it runs. What the runner reads from the engine's
insides goes through ``engine_view``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import dataclass, field

from batchlab.backends import ModelBackend
from batchlab.checks import check_bool, check_int
from batchlab.engine import Engine
from batchlab.online import EngineInbox, EngineListener
from batchlab.requests import Request, RequestStatus
from batchlab.schedulers import SCHEDULERS, ContinuousBatcher, DynamicBatcher, StaticBatcher
from batchlab.schedulers.base import Scheduler
from batchlab.speculative import SpeculativeConfig, check_runs_on_the_model
from batchlab.serve.kv_transfer import KVConnector, KVTransferConfig, Received, TransferAsk
from batchlab.serve.engine_view import (TraceWindow, end_state, new_preemptions, new_steps, read_engine_stats,
                                       run_online_bounded)
from batchlab.serve.metrics import ServerMetrics
from batchlab.serve.protocol import APIError, GenerationRequest
from batchlab.serve.simulated import SimulatedDevice, placeholder_token_id

RELEASES = ("batch", "request")
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class ServerConfig:
    """What the server runs: the policy and its knobs, the KV cache, admission.

    ``max_num_seqs``: the most requests running at once (vLLM's meaning); the slot KV cache gets
    that many slots.
    ``max_model_len``: tokens per slot: the context window a request's prompt + output must fit.
    ``max_num_batched_tokens``, ``chunked_prefill``, ``long_prefill_token_threshold``: continuous.
    ``batch_size``: static. ``max_batch_size``, ``batch_timeout``: dynamic.
    ``release``: static and dynamic only: "batch" (a non-streaming server: every member's
    response is handed back when its batch ends, the course's default) or "request" (each member
    as it finishes, tokens streamed as computed).
    ``max_waiting``: requests waiting for admission before new ones get 429.
    ``paged``, ``block_size``, ``enable_prefix_caching`` (needs ``paged``), ``kv_cache_memory_bytes``:
    the KV cache (``ModelBackend``'s arguments): slots by default, or blocks of ``block_size``
    tokens; a memory budget in bytes instead of ``max_num_seqs`` sequences of ``max_model_len``.
    ``trace_window``: ended requests the engine's trace keeps (older ones are forgotten; the
    ``/metrics`` counters keep counting them).
    ``model_root``: what ``/v1/models`` reports as ``root`` (default: the tokenizer's folder).
    ``simulate``: None (the real model), or a simulated device's spec (``simulated.py``): steps
    last the time its cost model predicts and the generated tokens are placeholders.
    ``kv_transfer_config``: vLLM's ``--kv-transfer-config`` JSON (or a dict): the server plays the
    prefill or decode part of disaggregated serving (``kv_transfer.py``); needs continuous
    batching on a paged cache.
    ``speculative_config``: vLLM's ``--speculative-config`` JSON (or a dict): speculative decoding
    by prompt lookup or an early exit (``batchlab.speculative``); needs continuous batching and
    the real model.
    """

    policy: str = "continuous"
    max_num_seqs: int = 32
    max_model_len: int = 1024
    max_num_batched_tokens: int = 512
    chunked_prefill: bool = True
    long_prefill_token_threshold: int | None = None
    batch_size: int = 8
    max_batch_size: int = 8
    batch_timeout: float = 0.05
    release: str = "batch"
    max_waiting: int = 256
    model_name: str = DEFAULT_MODEL_NAME
    paged: bool = False
    block_size: int = 16
    enable_prefix_caching: bool = False
    kv_cache_memory_bytes: int | None = None
    trace_window: int = 10_000
    model_root: str | None = None
    simulate: str | None = None
    kv_transfer_config: str | None = None
    speculative_config: str | None = None

    def __post_init__(self) -> None:
        if self.policy not in SCHEDULERS:
            raise ValueError(f"policy={self.policy!r}; allowed: {list(SCHEDULERS)}")
        if self.release not in RELEASES:
            raise ValueError(f"release={self.release!r}; allowed: {list(RELEASES)}")
        for name in ("max_num_seqs", "max_model_len", "max_num_batched_tokens", "batch_size", "max_batch_size",
                     "max_waiting"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name}={value!r}; must be an int >= 1")
        if not (isinstance(self.batch_timeout, (int, float)) and self.batch_timeout >= 0):
            raise ValueError(f"batch_timeout={self.batch_timeout!r}; must be a number of seconds >= 0")
        if self.policy == "static" and self.max_waiting < self.batch_size:
            raise ValueError(f"max_waiting={self.max_waiting} < batch_size={self.batch_size}: a static batch "
                             "could never fill; allow at least batch_size waiting requests")
        if not isinstance(self.model_name, str) or not self.model_name:
            raise ValueError(f"model_name={self.model_name!r}; must be a non-empty string")
        for name in ("paged", "enable_prefix_caching", "chunked_prefill"):
            check_bool(name, getattr(self, name))
        check_int("block_size", self.block_size)
        check_int("trace_window", self.trace_window, hint="ended requests the trace keeps")
        check_int("kv_cache_memory_bytes", self.kv_cache_memory_bytes, allow_none=True)
        if self.enable_prefix_caching and not self.paged:
            raise ValueError("enable_prefix_caching=True; must come with paged=True (prefix caching "
                             "shares whole KV blocks)")
        if self.simulate is not None:
            SimulatedDevice.parse(self.simulate).kv_capacity_tokens(     # a bad spec or size fails here
                self.kv_cache_memory_bytes, self.max_num_seqs, self.max_model_len)
        if self.kv_transfer_config is not None:
            transfer = KVTransferConfig.parse(self.kv_transfer_config)   # stored as its JSON
            object.__setattr__(self, "kv_transfer_config", transfer.to_json())
            if self.policy != "continuous" or not self.paged:
                raise ValueError(f"kv_transfer_config with policy={self.policy!r}, paged={self.paged}; must come "
                                 "with policy='continuous' and paged=True (the hand-off names KV blocks, as vLLM's)")
        if self.speculative_config is not None:
            spec = SpeculativeConfig.parse(self.speculative_config)     # stored as its JSON
            object.__setattr__(self, "speculative_config", spec.to_json())
            check_runs_on_the_model(spec)
            if self.policy != "continuous" or self.simulate is not None:
                raise ValueError(f"speculative_config with policy={self.policy!r}, simulate={self.simulate!r}; must "
                                 "come with policy='continuous' (a request-level batch decodes in lockstep) and the "
                                 "real model (a simulated device has no tokens to draft from)")
            if spec.num_speculative_tokens >= self.max_model_len:
                raise ValueError(f"num_speculative_tokens={spec.num_speculative_tokens}; must be below "
                                 f"max_model_len={self.max_model_len}")

    def make_backend(self, lm) -> ModelBackend:
        return ModelBackend(lm, num_slots=self.max_num_seqs, max_seq_len=self.max_model_len,
                            kv_memory_bytes=self.kv_cache_memory_bytes, paged=self.paged,
                            block_size=self.block_size, enable_prefix_caching=self.enable_prefix_caching,
                            speculative_config=self.speculative_config)

    def make_scheduler(self) -> Scheduler:
        stream = self.release == "request"
        if self.policy == "static":
            return StaticBatcher(self.batch_size, stream=stream)
        if self.policy == "dynamic":
            return DynamicBatcher(self.max_batch_size, self.batch_timeout, stream=stream)
        return ContinuousBatcher(self.max_num_seqs, self.max_num_batched_tokens, self.chunked_prefill,
                                 self.long_prefill_token_threshold)


@dataclass
class Handle:
    """One accepted request, as its HTTP handler sees it: events arrive on ``events``.

    Events: ``("token", token_id)`` as each token becomes visible, then exactly one
    ``("end", status, finish_reason, timings, tokens)`` (``tokens``: the output when the policy
    hands it back whole at the end, else None), or ``("error", message)`` if the engine failed.
    """

    request_id: str
    gen: GenerationRequest
    req: Request
    received_unix: float
    x_request_id: str | None = None          # the client's X-Request-Id, echoed back
    stop_string_matched: bool = False        # set by the handler before it aborts the request
    tokens_seen: int = 0                     # token events the handler has taken so far
    transfer: TransferAsk | None = None      # disaggregated serving: the part this server plays
    received: Received | None = None         # the decode part: the KV it pulled
    events: asyncio.Queue = field(default_factory=asyncio.Queue)


class _Bridge(EngineListener):
    """Engine thread → event loop: each event is queued on its handle's asyncio queue; the
    metrics are fed on the way."""

    def __init__(self, runner: "EngineRunner") -> None:
        self.runner = runner
        self.preemptions_seen = 0
        self.last_step = None                  # the last engine step fed to the metrics
        self.cached: dict[str, int] = {}       # request id -> prompt tokens its first admission found cached
        self.checks_seen: dict[str, int] = {}  # request id -> its speculative checks counted so far

    def _count_steps(self) -> None:
        """Each engine step once (``vllm:iteration_tokens_total``), and each request's cached
        prompt tokens from its first chunk (which starts past them), until the request ends."""
        steps = new_steps(self.runner.engine, self.last_step)
        if not steps:
            return
        cached, metrics = self.cached, self.runner.metrics
        for step in steps:
            metrics.step(step.num_tokens)
            for c in step.chunks:
                if c.request_id not in cached:
                    cached[c.request_id] = c.start
        self.last_step = steps[-1]

    def _count_preemptions(self) -> None:
        runner = self.runner
        for p in new_preemptions(runner.scheduler, self.preemptions_seen):
            handle = runner.handles.get(p.request_id)
            prompt_len = handle.req.prompt_len if handle is not None else 0
            runner.metrics.preempted(prompt_len + p.num_output_tokens, runner.config.enable_prefix_caching)
            self.preemptions_seen += 1

    def _post(self, request_id: str, *events: tuple) -> None:
        """Queue ``events`` on the request's handle, all in one callback of the event loop."""
        handle = self.runner.handles.get(request_id)
        if handle is None:
            return
        put = handle.events.put_nowait
        try:
            self.runner.loop.call_soon_threadsafe(lambda: [put(e) for e in events])
        except RuntimeError:       # the event loop has closed: nobody is listening any more
            pass

    def on_token(self, req: Request, token: int, t: float) -> None:
        self.on_tokens(req, [token], t)

    def on_tokens(self, req: Request, tokens: list[int], t: float) -> None:
        """One step's tokens of ``req`` (several: a checked speculative draft): counted as vLLM
        counts a step's output (one inter-token gap), and queued in one go, so the stream sends
        them as one chunk."""
        runner = self.runner
        times = req.token_times
        self._count_steps()
        start = self.cached.get(req.request_id, 0)         # where its first chunk started
        external = start if req.kv_transfer_tokens and start == req.kv_transfer_tokens else 0
        previous = times[-len(tokens) - 1] if len(times) > len(tokens) else None
        runner.metrics.token(req.prompt_len, req.arrival_time, t, previous, runner.streams,
                             runner.config.enable_prefix_caching, start - external, external, len(tokens))
        self._count_preemptions()
        if req.spec_checks:                                # a checked draft emitted these tokens
            seen = self.checks_seen.get(req.request_id, 0)
            for drafted, accepted in req.spec_checks[seen:]:
                runner.metrics.checked(drafted, accepted)
            self.checks_seen[req.request_id] = len(req.spec_checks)
        if runner.streams:
            self._post(req.request_id, *[("token", token) for token in tokens])

    def on_end(self, req: Request, t: float) -> None:
        runner = self.runner
        self._count_preemptions()
        self._count_steps()
        self.cached.pop(req.request_id, None)
        self.checks_seen.pop(req.request_id, None)
        if req.exported_kv is not None:         # a prefill part finished: its KV waits for the decode part
            runner.connector.export(req.exported_kv, req)
            req.exported_kv = None
        handle = runner.handles.pop(req.request_id, None)
        if handle is not None:
            tokens = None if runner.streams else list(req.output_ids)
            timings = runner.timings(handle, req, t)
            reason = "stop" if handle.stop_string_matched else timings["finish_reason"]
            runner.metrics.finished(reason, timings, req.prompt_len, req.max_new_tokens, runner.streams)
            try:
                runner.loop.call_soon_threadsafe(handle.events.put_nowait, ("end", timings, tokens))
            except RuntimeError:
                pass
        self.preemptions_seen -= runner.window.note_end()


def _transfer_timings(handle: Handle) -> dict | None:
    """The hand-off in a response's timings: the part played, and for the decode part the KV received."""
    if handle.transfer is None:
        return None
    got = handle.received
    return {"part": handle.transfer.part, "from": handle.transfer.url, "kv_tokens": handle.req.kv_transfer_tokens,
            "kv_bytes": None if got is None else got.meta["bytes"],
            "transfer_s": None if got is None else got.transfer_s, "recomputed": handle.transfer.part == "decode"
            and got is None}


class EngineRunner:
    """The real model served by one online engine in its own thread (see the module docstring)."""

    def __init__(self, config: ServerConfig, lm=None) -> None:
        if not isinstance(config, ServerConfig):
            raise ValueError(f"config={config!r}; must be a ServerConfig")
        from batchlab.model import load_model, load_tokenizer
        self.config = config
        self.device = None if config.simulate is None else SimulatedDevice.parse(config.simulate)
        if self.device is None:
            self.lm = lm if lm is not None else load_model()
            self.tokenizer = self.lm.tokenizer
            self.backend = config.make_backend(self.lm)
        else:                       # no weights: the tokenizer, and a backend that predicts step times
            self.lm = None
            self.tokenizer = lm.tokenizer if lm is not None else load_tokenizer()
            self.backend = self.device.backend(config, placeholder_token_id(self.tokenizer))
        self.model_root = config.model_root or getattr(self.tokenizer, "name_or_path", None) or self.lm.name
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
        spec = None if config.speculative_config is None else SpeculativeConfig.parse(config.speculative_config)
        self.metrics = ServerMetrics(config.model_name, config.max_model_len,
                                     lambda: read_engine_stats(self.scheduler, self.backend.kv),
                                     spec.num_speculative_tokens if spec else 0)
        self.connector = None if config.kv_transfer_config is None else self._connector(config)

    def _connector(self, config: ServerConfig) -> KVConnector:
        """The KV hand-off of disaggregated serving, with this server's cache as a peer must match it."""
        transfer = KVTransferConfig.parse(config.kv_transfer_config)
        if self.device is None:
            kv = self.backend.kv
            cache = {"kv_shape": [kv.num_layers, kv.num_kv_heads, kv.head_dim], "dtype": str(kv.kv.dtype)[6:],
                     "simulated": None}
            per_token = kv.bytes_per_token
        else:
            shape, nbytes = self.device.shape, self.device.dtype_bytes
            cache = {"kv_shape": [shape.num_layers, shape.num_kv_heads, shape.head_dim], "dtype": f"{nbytes}-byte",
                     "simulated": shape.name}
            per_token = shape.kv_bytes_per_token(nbytes)
        return KVConnector(transfer, {**cache, "block_size": config.block_size}, per_token)

    # --- life -------------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the engine thread; events are delivered on ``loop``."""
        self.loop = loop
        self.thread = threading.Thread(target=self._run, name="batchlab-engine", daemon=True)
        self.thread.start()
        self.accepting = True

    def _run(self) -> None:
        try:
            self.trace = run_online_bounded(self.engine, self.inbox, _Bridge(self), self.window)
        except Exception as e:   # the engine broke its contract: say so to every waiting client
            self.error = f"engine failed: {type(e).__name__}: {e}"
            self.accepting = False
            for rid in list(self.handles):
                handle = self.handles.pop(rid, None)
                if handle is not None:
                    self.metrics.failed(1)          # request_success{finished_reason="error"}
                if handle is not None and self.loop is not None:
                    try:
                        self.loop.call_soon_threadsafe(handle.events.put_nowait, ("error", self.error))
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
        stays): an app's route functions outlive their server in FastAPI's caches, holding this runner."""
        if self.thread is not None and self.thread.is_alive():
            raise RuntimeError("release_memory() while the engine thread runs; shut down and join it first")
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
        if not self.accepting:
            why = self.error or (f"the server is shutting down ({self.shutdown_reason})"
                                 if self.shutdown_reason else "the engine is not running")
            raise APIError(503, f"not accepting requests: {why}", None, "service_unavailable")
        if self.num_waiting() >= self.config.max_waiting:
            self.num_refused += 1
            self.metrics.refused()
            raise APIError(429, f"{self.config.max_waiting} requests are already waiting for admission "
                                f"(--max-waiting {self.config.max_waiting}); retry later", None,
                           "rate_limit_exceeded", headers={"Retry-After": "1"})
        if self.config.simulate and gen.sampling.logprobs is not None:
            raise APIError(400, "logprobs: a simulated server draws placeholder tokens, not the model's, so it has "
                                "no log-probabilities; ask a server that runs the model", "logprobs")
        eos = () if gen.ignore_eos or self.tokenizer.eos_token_id is None else (self.tokenizer.eos_token_id,)
        stop_ids = tuple(dict.fromkeys(eos + tuple(gen.stop_token_ids)))
        prefix = "cmpl" if gen.kind == "completion" else "chatcmpl"
        rid = f"{prefix}-{uuid.uuid4().hex[:24]}"
        n = len(gen.prompt_ids) - 1 if received is not None else 0    # KV received: all but the last token's
        req = Request(rid, gen.prompt_ids, gen.max_tokens, 0.0, gen.sampling, stop_token_ids=stop_ids,
                      kv_transfer_tokens=n, remote_kv=received.kv if n else None,
                      kv_transfer_seconds=received.transfer_s if n and self.device is not None else 0.0,
                      export_kv=transfer is not None and transfer.part == "prefill")
        reason = self.scheduler.why_unschedulable(req)
        if reason is not None:
            raise APIError(400, f"this server can never run this request: {reason}",
                           "messages" if gen.kind == "chat" else "prompt")
        handle = Handle(rid, gen, req, time.time() if received_unix is None else received_unix, x_request_id,
                        transfer=transfer, received=received)
        self.handles[rid] = handle
        try:
            self.inbox.add(req)
        except RuntimeError:
            self.handles.pop(rid, None)
            raise APIError(503, "not accepting requests: the server is shutting down", None,
                           "service_unavailable") from None
        self.num_accepted += 1
        return handle

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
            "finish_reason": end.finish_reason,
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
                "max_model_len": self.config.max_model_len, "trace_window": self.config.trace_window,
                "trace_forgotten": self.window.num_forgotten, "simulated": self.config.simulate,
                "kv_exports_held": None if self.connector is None else len(self.connector.exports),
                "kv_exports_expired": None if self.connector is None else self.connector.exports.num_expired}
