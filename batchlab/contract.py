"""What the engine checks, so that a broken policy or backend fails loudly instead of losing work.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

from batchlab.backends.base import Backend
from batchlab.clock import Clock
from batchlab.listener import EngineListener
from batchlab.plan import Idle, ScheduledChunk
from batchlab.requests import FinishReason, Request, RequestStatus
from batchlab.schedulers.base import Scheduler
from batchlab.trace import StepRecord, Trace


class EngineError(RuntimeError):
    """The scheduler or backend broke the contract (a lost request, a deadlock, a bad plan)."""


class ServingEngine(Protocol):
    """An engine as its drivers see it: a run's state, one step, and the ways a request ends."""

    scheduler: Scheduler
    backend: Backend
    clock: Clock
    requests: dict[str, Request]     # every request of the run, in arrival order
    release_times: dict[str, float | None]   # when each ended request's response went out
    steps: list[StepRecord]          # every step of the run
    fast_decode_runs: bool           # may the simulator's fast path predict runs of decode steps?

    def start(self, listener: EngineListener | None = None) -> float: ...
    def add_request(self, req: Request, now: float) -> None: ...
    def step(self, now: float) -> StepRecord | Idle: ...
    def end_request(self, req: Request, reason: FinishReason, t: float,
                    detail: str | None = None) -> None: ...
    def abort(self, request_id: str, detail: str, now: float) -> bool: ...
    def release_ended(self, t: float) -> None: ...
    def finish(self, **meta) -> Trace: ...


def check_parts(scheduler: Scheduler, backend: Backend) -> None:
    """An engine's parts fit together: a batchlab scheduler, a batchlab backend, and a policy that
    can check drafts when the backend drafts."""
    if not isinstance(scheduler, Scheduler):
        raise ValueError(f"scheduler={scheduler!r}; must be a batchlab Scheduler "
                         "(StaticBatcher, ...)")
    if not isinstance(backend, Backend):
        raise ValueError(f"backend={backend!r}; must be a batchlab Backend "
                         "(SimBackend, ModelBackend)")
    if backend.speculative is not None and not scheduler.checks_drafts:
        raise ValueError(f"{type(scheduler).__name__} cannot check speculative drafts: a "
                         "request-level batch runs its members in lockstep, one token a step; "
                         "use ContinuousBatcher with speculative decoding, or a backend without "
                         "a speculative config")


def fresh_workload(requests: Sequence[Request]) -> list[Request]:
    """Check the workload (requests, sorted by arrival, unique ids) and copy it without run
    state."""
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
            raise ValueError(f"requests are not sorted by arrival_time: {req.request_id!r} "
                             f"arrives at {req.arrival_time} after {previous.request_id!r} at "
                             f"{previous.arrival_time}; "
                             "sort them (sorted(reqs, key=lambda r: r.arrival_time))")
        previous = req
    if duplicates:
        raise ValueError(f"request ids must be unique; repeated: {sorted(set(duplicates))[:10]}")
    return [req.fresh_copy() for req in requests]


def check_chunk(c: ScheduledChunk, req: Request | None) -> Request:
    """The request a planned chunk computes for, after checking that the chunk may run."""
    rid = c.request_id
    if req is None:
        raise EngineError(f"the plan has a chunk for {rid!r}, which is not in this workload")
    # (an identity check: this runs for every chunk)
    if req.status is not RequestStatus.RUNNING:
        raise EngineError(f"the plan computes tokens for {rid!r}, which is not running "
                          f"({req.status.value}); a scheduler plans only requests it has "
                          "admitted and that have not ended")
    # (drafted tokens are not known yet)
    first, computed = c.start, c.start + c.num_tokens - len(c.draft)
    if first != req.num_computed_tokens:
        raise EngineError(f"the plan computes tokens of {rid!r} from {first}, but "
                          f"{req.num_computed_tokens} are computed (a chunk must continue "
                          "exactly where the cache ends, and a request may appear only once "
                          "per step)")
    known = req.prompt_len + len(req.output_ids)
    if computed > known:
        raise EngineError(f"the plan computes tokens [{first}, {computed}) of {rid!r}, which has "
                          f"only {known} known tokens")
    if c.samples and computed != known:
        raise EngineError(f"the chunk of {rid!r} samples but stops at token {computed} of {known}; "
                          "only the chunk that reaches the last known token samples")
    if not c.samples and computed == known:
        raise EngineError(f"the chunk of {rid!r} reaches its last known token ({known}) but "
                          "does not sample; the request would never get its next token")
    return req


def check_emitted(req: Request, draft: tuple[int, ...], emitted: list[int] | None) -> list[int]:
    """What a backend's check of ``req``'s draft emitted, after checking it is 1 to ``k + 1``
    tokens: the draft's accepted prefix, then one more."""
    if (not emitted or len(emitted) > len(draft) + 1
            or list(draft[:len(emitted) - 1]) != emitted[:-1]):
        raise EngineError(f"the backend's check of {req.request_id!r}'s draft of {len(draft)} "
                          f"tokens emitted {emitted!r}: must be 1 to {len(draft) + 1} tokens, "
                          "the draft's accepted prefix then one")
    return emitted


def check_ended(workload: Sequence[Request], release_times: Mapping[str, float | None],
                scheduler) -> None:
    """Every request FINISHED with exactly its tokens and released once, REJECTED with none, or
    ABORTED with at most its tokens; rejected and aborted ones say why."""
    for req in workload:
        rid, num_out = req.request_id, len(req.output_ids)
        if len(req.token_times) != num_out:
            raise EngineError(f"request {rid!r} has {num_out} tokens but "
                              f"{len(req.token_times)} token times")
        if req.status is RequestStatus.ABORTED or req.status is RequestStatus.REJECTED:
            limit = req.max_new_tokens if req.status is RequestStatus.ABORTED else 0
            if num_out > limit or not req.finish_detail:
                raise EngineError(f"{req.status.value} request {rid!r} has {num_out} tokens and "
                                  f"finish_detail {req.finish_detail!r}")
            continue
        if req.status is not RequestStatus.FINISHED:
            raise EngineError(f"request {rid!r} ended the run {req.status.value}, with "
                              f"{num_out} of {req.max_new_tokens} tokens: it was lost")
        if req.finish_reason is FinishReason.LENGTH and num_out != req.max_new_tokens:
            raise EngineError(f"request {rid!r} finished by length with {num_out} of "
                              f"{req.max_new_tokens} tokens")
        if req.finish_reason is FinishReason.STOP and (
                num_out > req.max_new_tokens or req.output_ids[-1] not in req.stop_token_ids):
            raise EngineError(f"request {rid!r} finished by a stop token it does not end with")
        if release_times[rid] is None:
            raise EngineError(f"request {rid!r} finished but {scheduler!r} never released it")


def policy_params(scheduler) -> dict:
    """The policy's settings, from its config dataclass when it has one."""
    config = scheduler.config
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return {}
