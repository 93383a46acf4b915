"""The engine: one loop that serves a workload with a scheduler and a backend, and records it.

One pass of the loop::

    admit arrivals up to now          (reject what the policy could never run, with the reason)
    plan = scheduler.schedule(now)
    if the plan is empty:             jump (virtual clock) or sleep (wall clock) to the next
                                      arrival or the scheduler's timer; stop when nothing is left
    result = backend.run(plan)        the step's new tokens and how long it took
    record the step; apply it         each chunk's tokens are now computed; each sampled token
                                      is appended with the step's end time; a request that
                                      reached max_new_tokens (or a stop token) finishes
    released = scheduler.on_step_end(plan, end)    responses handed back to clients now

Rules the engine keeps:

- **Inputs are never changed.** ``run`` serves fresh copies (``Request.fresh_copy``), so the same
  workload list can be served again under another policy and compared.
- **Nobody is lost.** A request the policy can never run (``scheduler.why_unschedulable``) is
  rejected on arrival: status REJECTED, ``finish_reason`` starting with ``"rejected: "`` and
  saying why, ``release_time`` the time it was turned away. It stays in the trace. A scheduler
  that holds work but plans nothing, with no timer and no arrival left, is a bug: the engine
  raises instead of dropping the work. At the end the engine checks that every request is
  FINISHED with exactly its tokens (``max_new_tokens``, or fewer ending in a stop token) and was
  released once, or was REJECTED with none.
- **Plans are checked.** A chunk must start where its request's computed tokens end, stay within
  its known tokens, and sample exactly when it reaches the last known token.
- Once every request of the workload has arrived the engine calls ``scheduler.start_draining()``.
- When a request ends (finished or rejected) the engine calls ``backend.release(request_id)``, so
  the backend can forget what it kept for it (a sampler's generator, say).

Online mode (``run_online``, see ``online.py``): the same loop on the wall clock, with requests
added and aborted while it runs through a thread-safe ``EngineInbox`` read at the top of every
pass; when idle it waits on the inbox instead of ending, and a listener hears every token and
every end as it happens. An aborted request ends ABORTED with ``finish_reason`` "aborted: <why>".

The clocks are described in ``clock.py``: ``"virtual"`` (time moves by each step's reported
duration and skips idle gaps) or ``"wall"`` (real time; requests arrive in real time).

Fast path (simulator only): when the scheduler declares that it simply continues decoding and
the backend declares that it predicts decode runs, whole runs of decode steps are computed in
bulk (``batchlab.backends.decode_runs``). The trace is the same; pass ``fast_decode_runs=False``
to turn it off.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Sequence

from batchlab.backends.base import Backend
from batchlab.backends.decode_runs import DecodeRun, predict_decode_steps
from batchlab.clock import Clock, make_clock
from batchlab.online import ABORTED_PREFIX, EngineInbox, EngineListener
from batchlab.plan import StepPlan
from batchlab.requests import Request, RequestStatus
from batchlab.schedulers.base import Scheduler
from batchlab.trace import RequestRecord, StepRecord, Trace

_FINISHED = RequestStatus.FINISHED
_REJECTED = RequestStatus.REJECTED
_ABORTED = RequestStatus.ABORTED
REJECTED_PREFIX = "rejected: "


class EngineError(RuntimeError):
    """The scheduler or backend broke the contract (a lost request, a deadlock, a bad plan)."""


# --- the engine ---------------------------------------------------------------------------------------
class Engine:
    """Serve workloads with ``scheduler`` (the policy) on ``backend`` (the model or the simulator).

    ``clock``: ``"virtual"`` (default) or ``"wall"``; see ``clock.py``.
    ``fast_decode_runs``: allow the simulator's fast path (module docstring); it is used only on
    the virtual clock, with a backend whose ``predicts_decode_runs`` is True and a scheduler
    whose ``continues_decoding`` says yes. The trace is the same either way.
    """

    def __init__(self, scheduler: Scheduler, backend: Backend, clock: str | Clock = "virtual",
                 fast_decode_runs: bool = True) -> None:
        if not isinstance(scheduler, Scheduler):
            raise ValueError(f"scheduler={scheduler!r}; must be a batchlab Scheduler "
                             "(StaticBatcher, DynamicBatcher, ContinuousBatcher, ...)")
        if not isinstance(backend, Backend):
            raise ValueError(f"backend={backend!r}; must be a batchlab Backend (SimBackend, ModelBackend)")
        if not isinstance(fast_decode_runs, bool):
            raise ValueError(f"fast_decode_runs={fast_decode_runs!r}; must be True or False")
        self.scheduler = scheduler
        self.backend = backend
        self.clock = make_clock(clock)
        self.fast_decode_runs = fast_decode_runs

    def __repr__(self) -> str:
        return f"Engine({self.scheduler!r}, {self.backend!r}, clock={self.clock.name!r})"

    # --- one run -------------------------------------------------------------------------------------
    def run(self, requests: Sequence[Request], progress: bool = False) -> Trace:
        """Serve ``requests`` (sorted by arrival, unique ids) to the end and return the trace.

        The requests themselves are not modified; the trace holds what happened to each.
        ``progress=True`` shows a tqdm bar over ended (finished or rejected) requests.
        """
        return self._serve(_fresh_workload(requests), progress)

    def run_online(self, inbox: EngineInbox, listener: EngineListener | None = None) -> Trace:
        """Serve what ``inbox`` is given, as it comes, on the wall clock, until ``inbox.stop``.

        Returns the trace of every request it saw (see ``online.py``). Runs in the calling thread;
        a server calls it from a thread of its own.
        """
        if self.clock.name != "wall":
            raise ValueError(f"run_online needs the wall clock (Engine(..., clock='wall')), not {self.clock.name!r}: "
                             "requests arrive in real time")
        if not isinstance(inbox, EngineInbox):
            raise ValueError(f"inbox={inbox!r}; must be an EngineInbox")
        return self._serve([], False, inbox, listener or EngineListener())

    def _serve(self, workload: list[Request], progress: bool, inbox: EngineInbox | None = None,
               listener: EngineListener | None = None) -> Trace:
        scheduler, backend = self.scheduler, self.backend
        if scheduler.has_pending():
            raise EngineError(f"{scheduler!r} still holds requests from an earlier run; use a new scheduler")
        if backend.kv.used_tokens:
            raise EngineError(f"the backend's KV cache still holds {backend.kv.used_tokens} tokens; "
                              "use a new backend")
        backend.reset()
        scheduler.bind(backend.kv)
        wall_start = time.perf_counter()
        run = _Run(self, workload, progress, inbox, listener)
        # A large run creates millions of small objects and no reference cycles; Python's cyclic
        # garbage collector would scan them all again and again (about a third of a simulation's
        # time), so it is paused for the run. Reference counting still frees everything.
        # (Not online: the collector is process-wide, and a server's other threads need it.)
        gc_was_enabled = gc.isenabled()
        if inbox is None:
            gc.disable()
        try:
            run.loop()
            run.check_invariants()
            trace = run.trace()
        finally:
            if gc_was_enabled:
                gc.enable()
            run.close()
        trace.meta["wall_seconds"] = time.perf_counter() - wall_start
        return trace


class _Run:
    """The state of one ``Engine.run``: the loop, applying steps, the fast path, the checks."""

    def __init__(self, engine: Engine, workload: list[Request], progress: bool,
                 inbox: EngineInbox | None = None, listener: EngineListener | None = None) -> None:
        self.inbox = inbox          # online mode only (run_online)
        self.listener = listener
        self.scheduler = engine.scheduler
        self.backend = engine.backend
        self.clock = engine.clock
        self.workload = workload
        self.by_id = {r.request_id: r for r in workload}
        self.steps: list[StepRecord] = []
        self.release_times: dict[str, float | None] = dict.fromkeys(self.by_id)
        self.num_fast_steps = 0
        # Paged KV: the scheduler's preemption log, from this run's first entry on.
        self.preemption_log = self.scheduler.preemptions
        self.first_preemption = len(self.preemption_log)
        self.fast = (engine.fast_decode_runs and self.clock.name == "virtual"
                     and self.backend.predicts_decode_runs and self.scheduler.may_continue_decoding)
        self.bar = None
        if progress:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=len(workload), unit="req", desc=type(self.scheduler).__name__)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    # --- the loop ------------------------------------------------------------------------------------
    def loop(self) -> None:
        scheduler, clock, workload = self.scheduler, self.clock, self.workload
        num_requests = len(workload)
        next_arrival = 0                  # index of the next request to arrive
        now = clock.start()
        # After a step in which every chunk sampled and nobody finished: that plan (and its
        # DecodeRun and offset, if the fast path made it), so the scheduler can be asked whether
        # it simply continues with one decode each.
        decoding: tuple[StepPlan, DecodeRun | None, int] | None = None
        while True:
            now = clock.now(now)
            if self.inbox is not None:       # online: new requests, aborts, stop
                if not self._read_inbox(now):
                    return
                next_arrival = num_requests = len(workload)   # every added request is admitted
            while next_arrival < num_requests and workload[next_arrival].arrival_time <= now:
                self._admit(workload[next_arrival], now)
                next_arrival += 1
            if next_arrival == num_requests and not scheduler.draining and self.inbox is None:
                scheduler.start_draining()
            arrival_time = workload[next_arrival].arrival_time if next_arrival < num_requests else None

            if decoding is not None and self.fast and scheduler.continues_decoding(decoding[0]):
                now, decoding = self._decode_run(decoding, now, arrival_time)
                continue

            plan = scheduler.schedule(now)
            if plan.is_empty:
                decoding = None
                wake_at = plan.wake_at
                if wake_at is not None and not wake_at > now:
                    raise EngineError(f"{scheduler!r} planned nothing at now={now} but set wake_at={wake_at}, "
                                      "which is not in the future; it would never make progress")
                targets = [t for t in (arrival_time, wake_at) if t is not None]
                if self.inbox is not None:   # online: wait for a command (or the timer)
                    self.inbox.wait(min(targets) - now if targets else None)
                    continue
                if not targets:
                    if scheduler.has_pending():
                        stuck = [r.request_id for r in workload if not r.is_done]
                        raise EngineError(
                            f"deadlock: {scheduler!r} holds {len(stuck)} unfinished requests (first: "
                            f"{stuck[:5]}) but planned nothing, set no timer, and no request is left "
                            "to arrive")
                    return
                now = clock.wait_until(now, min(targets))
                continue

            result, start, duration = clock.timed_step(now, lambda: self.backend.run(plan, self.by_id))
            end = start + duration
            self.steps.append(StepRecord(len(self.steps), start, duration, plan.chunks,
                                         plan.held_slots, plan.batch_id))
            all_sampled, num_finished = self._apply(plan, result.new_tokens, start, end)
            self._release(scheduler.on_step_end(plan, end), end)
            now = end
            decoding = (plan, None, 0) if all_sampled and not num_finished else None

    # --- arrivals ------------------------------------------------------------------------------------
    def _admit(self, req: Request, now: float) -> None:
        reason = self.scheduler.why_unschedulable(req)
        if reason is None:
            self.scheduler.add_request(req)
            return
        req.status = _REJECTED
        req.finish_reason = REJECTED_PREFIX + reason
        self.release_times[req.request_id] = now
        self.backend.release(req.request_id)
        if self.bar is not None:
            self.bar.update(1)
        if self.listener is not None:
            self.listener.on_end(req, now)

    # --- online: the inbox -----------------------------------------------------------------------
    def _read_inbox(self, now: float) -> bool:
        """Admit added requests, apply aborts and a stop. False when the loop should end (stopped
        and nothing left in flight)."""
        commands = self.inbox.take()
        workload, by_id = self.workload, self.by_id
        perf_now = time.perf_counter()
        for req, added_at in commands.adds:
            if req.request_id in by_id:      # never served twice, never lost: rejected on the spot
                req.status = _REJECTED
                req.finish_reason = REJECTED_PREFIX + f"request id {req.request_id!r} is already in use"
                self.listener.on_end(req, now)
                continue
            # It arrived when it was added (on this clock), never before the previous arrival.
            previous = workload[-1].arrival_time if workload else 0.0
            req.arrival_time = max(now - (perf_now - added_at), previous, 0.0)
            workload.append(req)
            by_id[req.request_id] = req
            self.release_times[req.request_id] = None
            self._admit(req, now)
        aborts = commands.aborts
        if commands.stop_reason is not None:
            aborts = aborts + [(r.request_id, commands.stop_reason) for r in workload if not r.is_done]
        if aborts:
            self._abort(aborts, now)
        return not (self.inbox.stopping and not self.scheduler.has_pending())

    def _abort(self, aborts: list[tuple[str, str]], now: float) -> None:
        """End each (request id, reason) now; a running one leaves its scheduler (and KV) at once."""
        any_running = False
        for rid, reason in aborts:
            req = self.by_id.get(rid)
            if req is None or req.is_done:
                continue                     # unknown or already ended: nothing to do
            if req.status is RequestStatus.WAITING:
                if not self.scheduler.remove_waiting(req):
                    raise EngineError(f"{self.scheduler!r} could not take waiting request {rid!r} out of "
                                      "its queue (remove_waiting)")
            else:
                any_running = True
            req.status = _ABORTED
            req.finish_reason = ABORTED_PREFIX + reason
            self.release_times[rid] = now
            self.backend.release(rid)
            self.listener.on_end(req, now)
        if any_running:   # the scheduler drops ended requests and frees their KV, as after a step
            self._release(self.scheduler.on_step_end(StepPlan(), now), now)

    # --- one step's results ---------------------------------------------------------------------------
    def _apply(self, plan: StepPlan, new_tokens: dict[str, int], start: float, end: float) -> tuple[bool, int]:
        """Write a step's results into its requests. Returns (did every chunk sample, how many finished)."""
        by_id = self.by_id
        all_sampled = True
        num_finished = 0
        for c in plan.chunks:
            rid = c.request_id
            req = by_id.get(rid)
            if req is None:
                raise EngineError(f"the plan has a chunk for {rid!r}, which is not in this workload")
            if req.status is _FINISHED or req.status is _REJECTED or req.status is _ABORTED:
                raise EngineError(f"the plan computes tokens for {rid!r}, which has already ended "
                                  f"({req.status.value})")
            first = c.start
            if first != req.num_computed_tokens:
                raise EngineError(f"the plan computes tokens of {rid!r} from {first}, but {req.num_computed_tokens} "
                                  "are computed (a chunk must continue exactly where the cache ends, and a "
                                  "request may appear only once per step)")
            n = c.num_tokens
            computed = first + n
            output_ids = req.output_ids
            known = req.prompt_len + len(output_ids)
            if computed > known:
                raise EngineError(f"the plan computes tokens [{first}, {computed}) of {rid!r}, which has only "
                                  f"{known} known tokens")
            if req.first_scheduled_time is None:
                req.first_scheduled_time = start
            req.num_computed_tokens = computed
            if computed != known:
                if c.samples:
                    raise EngineError(f"the chunk of {rid!r} samples but stops at token {computed} of {known}; "
                                      "only the chunk that reaches the last known token samples")
                all_sampled = False
                continue
            if not c.samples:
                raise EngineError(f"the chunk of {rid!r} reaches its last known token ({known}) but does not "
                                  "sample; the request would never get its next token")
            try:
                token = new_tokens[rid]
            except KeyError:
                raise EngineError(f"the backend returned no token for {rid!r}, whose chunk samples") from None
            output_ids.append(token)
            req.token_times.append(end)
            if self.listener is not None:
                self.listener.on_token(req, token, end)
            if token in req.stop_token_ids:
                self._finish(req, "stop", end)
                num_finished += 1
            elif len(output_ids) >= req.max_new_tokens:
                self._finish(req, "length", end)
                num_finished += 1
        return all_sampled, num_finished

    def _finish(self, req: Request, reason: str, t: float) -> None:
        req.status = _FINISHED
        req.finish_reason = reason
        self.backend.release(req.request_id)
        if self.bar is not None:
            self.bar.update(1)

    def _release(self, released: list[Request], t: float) -> None:
        times = self.release_times
        for req in released:
            if req.status is _ABORTED:
                continue                     # released when it was aborted
            rid = req.request_id
            if times.get(rid, 0.0) is not None:
                raise EngineError(f"{self.scheduler!r} released {rid!r} twice (or a request not in this "
                                  "workload)")
            if req.status is not _FINISHED:
                raise EngineError(f"{self.scheduler!r} released {rid!r} before it finished ({req.status.value})")
            times[rid] = t
            if self.listener is not None:
                self.listener.on_end(req, t)

    # --- the fast path -------------------------------------------------------------------------------
    def _decode_run(self, decoding: tuple[StepPlan, DecodeRun | None, int], now: float,
                    arrival_time: float | None) -> tuple[float, tuple | None]:
        """Run the continuing decode steps until the next arrival or the first finish.

        ``decoding`` is the last plan (every chunk sampled), its ``DecodeRun`` if the fast path made it,
        and its offset in that run. Returns the new ``now`` and, if nobody finished, the
        ``decoding`` triple for the last step, so the scheduler can be asked again.
        """
        plan, run, offset = decoding
        placeholder = self.backend.placeholder_token
        if run is None:
            run = DecodeRun(plan.chunks, self.by_id, placeholder)
        first_offset = offset
        stop_at = float("inf") if arrival_time is None else arrival_time
        records, offset = predict_decode_steps(run, offset, now, stop_at, len(self.steps),
                                               self.backend.step_duration, plan.held_slots, plan.batch_id)
        self.steps.extend(records)
        num_steps = offset - first_offset
        self.num_fast_steps += num_steps
        ends = [s.end for s in records]
        t = ends[-1]
        placeholder_tokens = [placeholder] * num_steps
        for req in run.requests:
            req.num_computed_tokens += num_steps
            req.output_ids.extend(placeholder_tokens)
            req.token_times.extend(ends)
        last_plan = StepPlan(run.chunks_at(offset), held_slots=plan.held_slots, batch_id=plan.batch_id)
        if offset != run.last_offset:
            return t, (last_plan, run, offset)
        for req, remaining in zip(run.requests, run.remaining):
            if remaining == offset:
                token = req.output_ids[-1]
                self._finish(req, "stop" if token in req.stop_token_ids else "length", t)
        self._release(self.scheduler.on_step_end(last_plan, t), t)
        return t, None

    def trace(self) -> Trace:
        """The run as a ``Trace``; the request lists move into it (the copies are the engine's)."""
        meta = {
            "policy": type(self.scheduler).__name__,
            "policy_params": _policy_params(self.scheduler),
            "scheduler": repr(self.scheduler),
            "clock": self.clock.name,
            "backend": self.backend.describe(),
            "num_requests": len(self.workload),
            "num_rejected": sum(r.status is _REJECTED for r in self.workload),
            "num_aborted": sum(r.status is _ABORTED for r in self.workload),
            "num_steps": len(self.steps),
            "num_fast_steps": self.num_fast_steps,
        }
        streamed = self.scheduler.streams_tokens
        records = [RequestRecord(r.request_id, r.arrival_time, r.prompt_len, r.max_new_tokens, r.status,
                                 r.finish_reason, r.first_scheduled_time, r.token_times,
                                 self.release_times[r.request_id], streamed, r.output_ids)
                   for r in self.workload]   # the lists move into the trace: the copies are ours
        preemptions = self.preemption_log[self.first_preemption:]
        meta["num_preemptions"] = len(preemptions)
        return Trace(requests=records, steps=self.steps, meta=meta, preemptions=preemptions)

    # --- the end -------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Every request FINISHED with exactly its tokens and released once, REJECTED with none, or
        ABORTED (online) with at most its tokens and a reason."""
        for req in self.workload:
            rid = req.request_id
            num_out = len(req.output_ids)
            if req.status is _ABORTED:
                if (num_out > req.max_new_tokens or len(req.token_times) != num_out
                        or not (req.finish_reason or "").startswith(ABORTED_PREFIX)):
                    raise EngineError(f"aborted request {rid!r} has {num_out} tokens, {len(req.token_times)} "
                                      f"token times and finish_reason {req.finish_reason!r}")
                continue
            if req.status is _REJECTED:
                if num_out or req.token_times:
                    raise EngineError(f"rejected request {rid!r} has {num_out} output tokens")
                continue
            if req.status is not _FINISHED:
                raise EngineError(f"request {rid!r} ended the run {req.status.value}, with {num_out} of "
                                  f"{req.max_new_tokens} tokens: it was lost")
            if len(req.token_times) != num_out:
                raise EngineError(f"request {rid!r} has {num_out} tokens but {len(req.token_times)} token times")
            if req.finish_reason == "length" and num_out != req.max_new_tokens:
                raise EngineError(f"request {rid!r} finished by length with {num_out} of {req.max_new_tokens} tokens")
            if req.finish_reason == "stop" and (num_out > req.max_new_tokens
                                                or req.output_ids[-1] not in req.stop_token_ids):
                raise EngineError(f"request {rid!r} finished by a stop token it does not end with")
            if self.release_times[rid] is None:
                raise EngineError(f"request {rid!r} finished but {self.scheduler!r} never released it")


# --- helpers -----------------------------------------------------------------------------------------
def _fresh_workload(requests: Sequence[Request]) -> list[Request]:
    """Check the workload (requests, sorted by arrival, unique ids) and copy it without run state."""
    if isinstance(requests, Request) or not isinstance(requests, (list, tuple)):
        raise ValueError(f"requests must be a list of Request, got {type(requests).__name__}")
    seen: set[str] = set()
    duplicates: list[str] = []
    previous: Request | None = None
    for i, req in enumerate(requests):
        if not isinstance(req, Request):
            raise ValueError(f"requests[{i}] is a {type(req).__name__}, not a Request")
        if req.request_id in seen:
            duplicates.append(req.request_id)
        seen.add(req.request_id)
        if previous is not None and req.arrival_time < previous.arrival_time:
            raise ValueError(f"requests are not sorted by arrival_time: {req.request_id!r} arrives at "
                             f"{req.arrival_time} after {previous.request_id!r} at {previous.arrival_time}; "
                             "sort them (sorted(reqs, key=lambda r: r.arrival_time))")
        previous = req
    if duplicates:
        raise ValueError(f"request ids must be unique; repeated: {sorted(set(duplicates))[:10]}")
    return [req.fresh_copy() for req in requests]


def _policy_params(scheduler: Scheduler) -> dict:
    """The policy's settings, from its config dataclass when it has one."""
    config = getattr(scheduler, "config", None)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return {}
