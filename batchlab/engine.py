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
- ``scheduler.draining`` becomes True once every request of the workload has arrived.

The clocks are described in ``clock.py``: ``"virtual"`` (time moves by each step's reported
duration and skips idle gaps) or ``"wall"`` (real time; requests arrive in real time).

Fast path (simulator only). Most steps of a large simulation are plain decode steps that repeat
with every sequence one token further on, until a request arrives or finishes. When the
scheduler promises exactly that (``Scheduler.continues_decoding``) and the backend can predict a
step from its size alone (``SimBackend.step_duration``), the engine computes such a run of steps
itself: one duration per step from the cost model, tokens appended per request in bulk, and
each step's chunks stored compactly (``DecodeRunChunks``, expanded when read). The trace is
the same as calling the scheduler every step (``tests/test_engine.py`` checks it); only the
Python work per decode token disappears. Pass ``fast_decode_runs=False`` to turn it off.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Iterator, Sequence

from .backends.base import Backend
from .clock import Clock, make_clock
from .plan import ScheduledChunk, StepPlan
from .requests import Request, RequestStatus
from .schedulers.base import Scheduler
from .trace import RequestRecord, StepRecord, Trace

_FINISHED = RequestStatus.FINISHED
_REJECTED = RequestStatus.REJECTED
REJECTED_PREFIX = "rejected: "


class EngineError(RuntimeError):
    """The scheduler or backend broke the contract (a lost request, a deadlock, a bad plan)."""


# --- compact storage for the fast path's steps ------------------------------------------------------
class DecodeRun:
    """A set of sequences decoding together, anchored at a step in which each of them sampled.

    That step is offset 0. At offset ``i`` every sequence decodes position ``starts[j] + i``,
    where ``starts[j]`` is the last position it computed at offset 0 (a decode's own position,
    or a completed prompt's last one). ``remaining[j]`` is how many more tokens sequence ``j``
    may produce after offset 0, so the run lasts at most ``min(remaining)`` steps: in that step
    the first sequence finishes.
    """

    __slots__ = ("request_ids", "starts", "requests", "remaining", "last_offset", "base_attention_pairs")

    def __init__(self, chunks: Sequence[ScheduledChunk], by_id: dict[str, Request], placeholder: int) -> None:
        self.request_ids = tuple([c.request_id for c in chunks])
        self.starts = tuple([c.start + c.num_tokens - 1 for c in chunks])
        self.requests = requests = [by_id[rid] for rid in self.request_ids]
        # A request whose stop tokens include the placeholder stops at its next token.
        self.remaining = remaining = [
            1 if r.stop_token_ids and placeholder in r.stop_token_ids else r.max_new_tokens - len(r.output_ids)
            for r in requests]
        self.last_offset = min(remaining)     # the step in which the first sequence finishes
        # A decode at position p attends to p + 1 keys; at offset i the step's sum of that is
        # base_attention_pairs + num_seqs * i.
        self.base_attention_pairs = sum(self.starts) + len(self.starts)

    @property
    def num_seqs(self) -> int:
        return len(self.starts)


class DecodeRunChunks(Sequence):
    """The chunks of one fast-path step: one decode per sequence of ``run`` at ``offset``.

    Behaves like the list of ``ScheduledChunk`` the scheduler would have returned (same items,
    same order; compares equal to it) but builds the chunk objects only when they are read.
    """

    __slots__ = ("run", "offset")

    def __init__(self, run: DecodeRun, offset: int) -> None:
        self.run = run
        self.offset = offset

    def __len__(self) -> int:
        return len(self.run.starts)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(self)[i]
        return ScheduledChunk(self.run.request_ids[i], self.run.starts[i] + self.offset, 1, True)

    def __iter__(self) -> Iterator[ScheduledChunk]:
        off = self.offset
        for rid, start in zip(self.run.request_ids, self.run.starts):
            yield ScheduledChunk(rid, start + off, 1, True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        n = len(self)
        return f"DecodeRunChunks({n} decode{'' if n == 1 else 's'} at offset {self.offset})"


class DecodeStepRecord(StepRecord):
    """A fast-path step: a ``StepRecord`` that stores its run and offset instead of a chunk list.

    ``chunks`` is built when read (a ``DecodeRunChunks``), and the counts need not build it.
    """

    def __init__(self, index: int, start: float, duration: float, run: DecodeRun, offset: int,
                 held_slots: int = 0, batch_id: int | None = None) -> None:
        self.index = index
        self.start = start
        self.duration = duration
        self.run = run
        self.offset = offset
        self.held_slots = held_slots
        self.batch_id = batch_id

    @property
    def chunks(self) -> DecodeRunChunks:  # type: ignore[override]
        return DecodeRunChunks(self.run, self.offset)

    @property
    def num_seqs(self) -> int:
        return len(self.run.starts)

    @property
    def num_tokens(self) -> int:
        return len(self.run.starts)

    @property
    def num_prefill_tokens(self) -> int:
        return 0

    @property
    def num_decode_seqs(self) -> int:
        return len(self.run.starts)


# --- the engine ---------------------------------------------------------------------------------------
class Engine:
    """Serve workloads with ``scheduler`` (the policy) on ``backend`` (the model or the simulator).

    ``clock``: ``"virtual"`` (default) or ``"wall"``; see ``clock.py``.
    ``fast_decode_runs``: allow the simulator's fast path (module docstring); it is used only on
    the virtual clock, with a backend that has ``step_duration`` and a scheduler whose
    ``continues_decoding`` says yes. The trace is the same either way.
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
        workload = _fresh_workload(requests)
        scheduler, backend = self.scheduler, self.backend
        if scheduler.has_pending():
            raise EngineError(f"{scheduler!r} still holds requests from an earlier run; use a new scheduler")
        if backend.kv.used_tokens:
            raise EngineError(f"the backend's KV cache still holds {backend.kv.used_tokens} tokens; "
                              "use a new backend")
        reset = getattr(backend, "reset", None)
        if callable(reset):
            reset()
        scheduler.draining = False
        scheduler.bind(backend.kv)
        wall_start = time.perf_counter()
        run = _Run(self, workload, progress)
        # A large run creates millions of small objects and no reference cycles; Python's cyclic
        # garbage collector would scan them all again and again (about a third of a simulation's
        # time), so it is paused for the run. Reference counting still frees everything.
        gc_was_enabled = gc.isenabled()
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

    def __init__(self, engine: Engine, workload: list[Request], progress: bool) -> None:
        self.scheduler = engine.scheduler
        self.backend = engine.backend
        self.clock = engine.clock
        self.workload = workload
        self.by_id = {r.request_id: r for r in workload}
        self.steps: list[StepRecord] = []
        self.release_times: dict[str, float | None] = dict.fromkeys(self.by_id)
        self.num_fast_steps = 0
        # Paged KV: the scheduler's preemption log, from this run's first entry on.
        self.preemption_log = getattr(self.scheduler, "preemptions", [])
        self.first_preemption = len(self.preemption_log)
        step_duration = getattr(self.backend, "step_duration", None)
        self.fast = (engine.fast_decode_runs and self.clock.name == "virtual" and callable(step_duration)
                     and hasattr(self.backend, "placeholder_token")
                     and type(self.scheduler).continues_decoding is not Scheduler.continues_decoding)
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
            while next_arrival < num_requests and workload[next_arrival].arrival_time <= now:
                self._admit(workload[next_arrival], now)
                next_arrival += 1
            if next_arrival == num_requests and not scheduler.draining:
                scheduler.draining = True
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
        if self.bar is not None:
            self.bar.update(1)

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
            if req.status is _FINISHED or req.status is _REJECTED:
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
        req.finish_time = t
        if self.bar is not None:
            self.bar.update(1)

    def _release(self, released: list[Request], t: float) -> None:
        times = self.release_times
        for req in released:
            rid = req.request_id
            if times.get(rid, 0.0) is not None:
                raise EngineError(f"{self.scheduler!r} released {rid!r} twice (or a request not in this "
                                  "workload)")
            if req.status is not _FINISHED:
                raise EngineError(f"{self.scheduler!r} released {rid!r} before it finished ({req.status.value})")
            times[rid] = t

    # --- the fast path -------------------------------------------------------------------------------
    def _decode_run(self, decoding: tuple[StepPlan, DecodeRun | None, int], now: float,
                    arrival_time: float | None) -> tuple[float, tuple | None]:
        """Run the continuing decode steps until the next arrival or the first finish.

        ``decoding`` is the last plan (every chunk sampled), its ``DecodeRun`` if the fast path made it,
        and its offset in that run. Returns the new ``now`` and, if nobody finished, the
        ``decoding`` triple for the last step, so the scheduler can be asked again.
        """
        plan, run, offset = decoding
        if run is None:
            run = DecodeRun(plan.chunks, self.by_id, self.backend.placeholder_token)
        last_offset = run.last_offset
        num_seqs = run.num_seqs
        pairs = run.base_attention_pairs + num_seqs * offset
        held_slots, batch_id = plan.held_slots, plan.batch_id
        step_duration = self.backend.step_duration
        steps = self.steps
        index = len(steps)
        stop_at = float("inf") if arrival_time is None else arrival_time
        first_offset = offset
        ends: list[float] = []
        t = now
        while True:
            offset += 1
            pairs += num_seqs
            duration = step_duration(num_seqs, num_seqs, pairs)
            start = t
            t = start + duration
            steps.append(DecodeStepRecord(index, start, duration, run, offset, held_slots, batch_id))
            index += 1
            ends.append(t)
            if offset == last_offset or t >= stop_at:
                break
        num_steps = offset - first_offset
        self.num_fast_steps += num_steps
        placeholder_tokens = [self.backend.placeholder_token] * num_steps
        for req in run.requests:
            req.num_computed_tokens += num_steps
            req.output_ids.extend(placeholder_tokens)
            req.token_times.extend(ends)
        last_plan = StepPlan(DecodeRunChunks(run, offset), held_slots=held_slots, batch_id=batch_id)
        if offset != last_offset:
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
            "backend": _describe(self.backend),
            "num_requests": len(self.workload),
            "num_rejected": sum(r.status is _REJECTED for r in self.workload),
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
        """Every request FINISHED with exactly its tokens and released once, or REJECTED with none."""
        for req in self.workload:
            rid = req.request_id
            num_out = len(req.output_ids)
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


def _describe(backend: Backend) -> str:
    """The backend's own description (``describe()``) if it has one, else its repr."""
    describe = getattr(backend, "describe", None)
    return str(describe()) if callable(describe) else repr(backend)
