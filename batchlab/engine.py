"""The engine: one step of a serving loop (``Engine.step``: plan, run, apply, release) and the
one place a request ends (``end_request``).

Inputs are never changed (``run`` serves fresh copies), plans are checked, and nobody is lost:
every request ends finished, rejected or aborted, with a reason. The drivers (``offline.py``,
``online.py``, a cluster's replicas) call it through ``contract.ServingEngine``. The rules and
their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

from batchlab.backends.base import Backend, StepResult
from batchlab.checks import check_bool
from batchlab.clock import Clock, make_clock
from batchlab.contract import (EngineError, check_chunk, check_emitted, check_ended, check_parts,
                               fresh_workload, policy_params)
from batchlab.listener import EngineListener, RequestOutput, StepOutput
from batchlab.offline import serve_offline
from batchlab.online import EngineInbox, serve_online
from batchlab.plan import Idle, StepPlan
from batchlab.requests import FinishReason, Request, RequestStatus, SpecState
from batchlab.schedulers.base import Scheduler
from batchlab.trace import StepRecord, Trace, request_records

__all__ = ["Engine", "EngineError", "Idle"]


def _mark_ended(req: Request, reason: FinishReason, detail: str | None) -> None:
    req.status, req.finish_reason, req.finish_detail = reason.status, reason, detail
    if req.kv_transfer is not None:
        req.kv_transfer.kv = None        # transferred KV it never used: not kept


class Engine:
    """Serve workloads with ``scheduler`` (the policy) on ``backend`` (the model or the simulator).

    ``clock``: ``"virtual"`` (default) or ``"wall"`` (``clock.py``). ``fast_decode_runs``: let the
    loop use the simulator's fast path (``sim/fast_path.py``) where it applies (same trace).
    """

    def __init__(self, scheduler: Scheduler, backend: Backend, clock: str | Clock = "virtual",
                 fast_decode_runs: bool = True) -> None:
        check_parts(scheduler, backend)
        check_bool("fast_decode_runs", fast_decode_runs)
        self.scheduler, self.backend = scheduler, backend
        self.clock = make_clock(clock)
        self.fast_decode_runs = fast_decode_runs
        self._new_run(EngineListener())

    def __repr__(self) -> str:
        return f"Engine({self.scheduler!r}, {self.backend!r}, clock={self.clock.name!r})"

    # --- the drivers ------------------------------------------------------------------------------
    def run(self, requests: Sequence[Request], progress: bool = False) -> Trace:
        """Serve ``requests`` (sorted by arrival, unique ids; left unmodified) to the end and return
        the trace; ``progress=True`` shows a bar over ended requests. (Driver: ``offline.py``.)"""
        return serve_offline(self, fresh_workload(requests), progress)

    def run_online(self, inbox: EngineInbox, listener: EngineListener | None = None) -> Trace:
        """Serve what ``inbox`` is given, as it comes, until ``inbox.stop`` (``online.py``)."""
        return serve_online(self, inbox, listener or EngineListener())

    # --- a run's state ----------------------------------------------------------------------------
    def _new_run(self, listener: EngineListener) -> None:
        self.requests: dict[str, Request] = {}          # every request of the run, in arrival order
        self.release_times: dict[str, float | None] = {}
        self.steps: list[StepRecord] = []
        self.listener = listener
        self.hears_steps = type(listener).on_step is not EngineListener.on_step

    def start(self, listener: EngineListener | None = None) -> float:
        """Begin a run (a driver calls this): a clean scheduler and backend; returns ``now``."""
        if self.scheduler.has_pending():
            raise EngineError(f"{self.scheduler!r} holds requests of an earlier run; use a new one")
        if self.backend.kv.used_tokens:
            raise EngineError(f"KV cache holds {self.backend.kv.used_tokens} tokens; use a new one")
        self.backend.reset()
        self.scheduler.bind(self.backend.kv)
        self._new_run(listener or EngineListener())
        self._first_preemption = len(self.scheduler.preemptions)
        return self.clock.start()

    def add_request(self, req: Request, now: float) -> None:
        """``req`` arrives at ``now``: queued by the scheduler, or rejected if it can never run."""
        rid = req.request_id
        if rid in self.requests:     # never served twice, never lost: rejected on the spot
            _mark_ended(req, FinishReason.REJECTED, f"request id {rid!r} is already in use")
            self.listener.on_end(req, now)
            return
        self.requests[rid], self.release_times[rid] = req, None
        if self.backend.speculative is not None:
            req.spec = SpecState()
        reason = self.scheduler.why_unschedulable(req)
        if reason is None:
            self.scheduler.add_request(req)
        else:
            self.end_request(req, FinishReason.REJECTED, now, reason)

    # --- one step ---------------------------------------------------------------------------------
    def step(self, now: float) -> StepRecord | Idle:
        """One step at ``now``: plan, run the plan, apply its tokens, tell the listener, release
        who ended."""
        before = len(self.scheduler.preemptions)     # this step's preemptions come after these
        plan = self.scheduler.schedule(now)
        if plan.is_empty:
            return Idle(plan.wake_at)
        start = self.clock.begin_step()
        result = self.backend.run(plan, self.requests)
        record = StepRecord(len(self.steps), start, self.clock.end_step(result), plan.chunks,
                            plan.held_slots, plan.batch_id)
        self.steps.append(record)
        end = record.end
        outputs = self._apply(plan, result, start, end)   # computed, sampled (or checked), ended
        if self.hears_steps:
            self.listener.on_step(StepOutput(record, outputs, self.scheduler.preemptions[before:]))
        self.release_ended(end)
        return record

    def _apply(self, plan: StepPlan, result: StepResult, start: float,
               end: float) -> list[RequestOutput]:
        """Each chunk's tokens are now computed; each sampling chunk's request gets its next token
        (at the step's end, with its logprobs if asked), or the tokens its checked draft emitted.
        Returns what each request got, for a listener that hears steps. (Per chunk per step.)"""
        requests, new_tokens, logprobs = self.requests, result.new_tokens, result.logprobs
        outputs: list[RequestOutput] = []
        for c in plan.chunks:
            req = requests.get(c.request_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                check_chunk(c, req)                         # raises, naming the rule the plan broke
            computed, known = c.start + c.num_tokens, req.prompt_len + len(req.output_ids)
            if c.draft:
                computed -= len(c.draft)                    # drafted tokens are not known yet
            if (c.start != req.num_computed_tokens or computed > known
                    or c.samples != (computed == known)):
                check_chunk(c, req)
            cached = None
            if req.first_scheduled_time is None:      # its first chunk starts past what was cached
                req.first_scheduled_time, cached = start, c.start
            req.num_computed_tokens = computed
            num_before, spec = len(req.output_ids), None
            if c.samples and c.draft:
                spec = self._apply_check(req, c.draft, result, end)
            elif c.samples:
                token = new_tokens.get(c.request_id)
                if token is None:
                    raise EngineError(f"the backend returned no token for {c.request_id!r}, "
                                      "whose chunk samples")
                self._append(req, token, end, logprobs.get(c.request_id) if logprobs else None)
            if c.samples and self.backend.speculative is not None:     # its draft for the next step
                req.spec.draft_ids = result.drafts.get(c.request_id, [])
            if self.hears_steps and (c.samples or cached):
                new = req.output_ids[num_before:]
                outputs.append(RequestOutput(req, new, req.finish_reason, cached, spec))
        return outputs

    def _append(self, req: Request, token: int, end: float, logprobs=None) -> bool:
        """Append one sampled token to ``req``; True if it ended the request (the end rule: a stop
        token once it has ``min_tokens``, or its last token)."""
        req.output_ids.append(token)
        req.token_times.append(end)
        if logprobs is not None:
            req.output_logprobs.append(logprobs)
        reason = req.ends_on(token)
        if reason is not None:
            self.end_request(req, reason, end)
        return reason is not None

    def _apply_check(self, req: Request, draft: tuple[int, ...], result: StepResult,
                     end: float) -> tuple[int, int]:
        """A checked draft: the accepted draft tokens are computed (their KV is in the cache), the
        rejected ones' KV room is given back (``kv.rollback``), and the emitted tokens are appended
        one by one, up to the first that ends the request. Returns ``(drafted, accepted)``."""
        emitted = check_emitted(req, draft, result.verified.get(req.request_id))
        accepted = len(emitted) - 1
        req.spec.checks.append((len(draft), accepted))
        req.num_computed_tokens += accepted
        if accepted < len(draft):
            self.scheduler.kv.rollback(req.request_id, len(draft) - accepted)
        logprobs = result.logprobs.get(req.request_id) or [None] * len(emitted)
        for token, token_logprobs in zip(emitted, logprobs):
            if self._append(req, token, end, token_logprobs):
                break
        return len(draft), accepted

    # --- how requests end -------------------------------------------------------------------------
    def end_request(self, req: Request, reason: FinishReason, t: float,
                    detail: str | None = None) -> None:
        """The one place a request ends. A finished one (length, stop) still sits in its batch, and
        its response goes out when the scheduler releases it; a rejected or aborted one is answered
        now (a running one frees its KV at the next ``scheduler.remove_ended()``)."""
        _mark_ended(req, reason, detail)
        if req.kv_export and reason in (FinishReason.LENGTH, FinishReason.STOP):   # for decoding
            self.listener.on_kv_export(req, self.backend.read_kv(req.request_id, req.prompt_len))
        self.backend.release(req.request_id)
        if reason in (FinishReason.REJECTED, FinishReason.ABORT):
            self.release_times[req.request_id] = t
            self.listener.on_end(req, t)

    def abort(self, request_id: str, detail: str, now: float) -> bool:
        """End ``request_id`` now with ``detail`` as the reason; False if unknown or ended."""
        req = self.requests.get(request_id)
        if req is None or req.is_done:
            return False
        if req.status is RequestStatus.WAITING and not self.scheduler.remove_waiting(req):
            raise EngineError(f"{self.scheduler!r} could not take waiting request {request_id!r} "
                              "out of its queue (remove_waiting)")
        self.end_request(req, FinishReason.ABORT, now, detail)
        return True

    def release_ended(self, t: float) -> None:
        """Ended requests leave the scheduler (freeing their KV); the responses of finished ones it
        releases go out at ``t`` (aborted and rejected ones went out when they ended)."""
        times = self.release_times
        for req in self.scheduler.remove_ended():
            if req.status is RequestStatus.ABORTED:
                continue
            rid = req.request_id
            if times.get(rid, 0.0) is not None:
                raise EngineError(f"{self.scheduler!r} released {rid!r} twice (or not of this run)")
            if req.status is not RequestStatus.FINISHED:
                raise EngineError(f"{self.scheduler!r} released {rid!r} early ({req.status.value})")
            times[rid] = t
            self.listener.on_end(req, t)

    # --- the end of a run -------------------------------------------------------------------------
    def finish(self, **meta) -> Trace:
        """Check that nobody was lost and return the run's trace (``meta`` adds labels)."""
        workload = list(self.requests.values())
        check_ended(workload, self.release_times, self.scheduler)
        records = request_records(workload, self.release_times, self.scheduler.streams_tokens)
        preemptions = self.scheduler.preemptions[self._first_preemption:]
        meta = {**_run_labels(self, workload), "num_preemptions": len(preemptions), **meta}
        return Trace(requests=records, steps=self.steps, meta=meta, preemptions=preemptions)


def _run_labels(engine: Engine, workload: list[Request]) -> dict:
    """What a run's trace says of it: the policy, the clock, the backend, the counts."""
    def count(status: RequestStatus) -> int:
        return sum(r.status is status for r in workload)
    scheduler = engine.scheduler
    return {"policy": type(scheduler).__name__, "policy_params": policy_params(scheduler),
            "scheduler": repr(scheduler), "clock": engine.clock.name,
            "backend": engine.backend.describe(), "num_requests": len(workload),
            "num_rejected": count(RequestStatus.REJECTED),
            "num_aborted": count(RequestStatus.ABORTED), "num_steps": len(engine.steps),
            "num_fast_steps": 0}
