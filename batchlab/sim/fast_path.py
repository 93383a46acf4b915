"""The simulator's fast path (``DecodeRuns``): runs of plain decode steps predicted in bulk, when
the policy promises them (``SteadyDecodes``) and for as long as the KV room lasts.

The trace is the same as stepping the engine every time (``tests/test_engine.py``). The rules
and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

from collections.abc import Callable

from batchlab.sim.backend import PLACEHOLDER_TOKEN, SimBackend
from batchlab.contract import ServingEngine
from batchlab.plan import DecodeChunks, Idle, chunk_attention_pairs
from batchlab.requests import Request, RequestStatus
from batchlab.schedulers.steady import SteadyDecodes
from batchlab.trace import StepRecord


class DecodeRun:
    """A set of sequences decoding together, anchored at a step in which each of them sampled.

    That step is offset 0. At offset ``i`` every sequence decodes position ``starts[j] + i``,
    where ``starts[j]`` is the last position it computed at offset 0 (a decode's own position,
    or a completed prompt's last one). ``remaining[j]`` is how many more tokens sequence ``j``
    may produce after offset 0, so the run lasts at most ``min(remaining)`` steps: in that step
    the first sequence finishes.
    """

    __slots__ = ("request_ids", "starts", "requests", "remaining", "last_offset",
                 "base_attention_pairs", "held_slots", "batch_id")

    def __init__(self, step: StepRecord, requests: list[Request]) -> None:
        self.request_ids = tuple([r.request_id for r in requests])
        self.starts = tuple([c.start + c.num_tokens - 1 for c in step.chunks])
        self.requests = requests
        self.held_slots, self.batch_id = step.held_slots, step.batch_id
        self.remaining = [r.tokens_to_end(PLACEHOLDER_TOKEN) for r in requests]
        self.last_offset = min(self.remaining)     # the step in which the first sequence finishes
        # The step at offset i decodes position starts[j] + i for every j; its attention pairs
        # are base_attention_pairs + num_seqs * i.
        self.base_attention_pairs = sum(chunk_attention_pairs(s, 1) for s in self.starts)

    @property
    def num_seqs(self) -> int:
        return len(self.starts)

    def chunks_at(self, offset: int) -> DecodeChunks:
        return DecodeChunks(self.request_ids, self.starts, offset)


def predict_decode_steps(run: DecodeRun, offset: int, now: float, stop_at: float, max_offset: int,
                         first_index: int, step_duration: Callable[[int, int, int], float],
                         ) -> list[StepRecord]:
    """The steps after ``offset`` of ``run``, from ``now``, until ``max_offset`` or the first step
    that ends at or after ``stop_at`` (the next arrival). ``step_duration(num_seqs, num_tokens,
    attention_pairs)`` is the simulator's."""
    n = run.num_seqs
    pairs = run.base_attention_pairs + n * offset
    records: list[StepRecord] = []
    t = now
    while offset < max_offset:
        offset += 1
        pairs += n
        duration = step_duration(n, n, pairs)
        records.append(StepRecord(first_index + len(records), t, duration, run.chunks_at(offset),
                                  run.held_slots, run.batch_id, (n, 0, n)))
        t += duration
        if t >= stop_at:
            break
    return records


class DecodeRuns:
    """The fast path as the serving loop uses it: ``after_step`` after every engine step, then
    ``advance`` before the next one, which computes a run of steps when one is steady."""

    @staticmethod
    def applies(engine: ServingEngine) -> bool:
        """On the simulator's virtual clock (a step's duration is known before it runs)."""
        return (engine.fast_decode_runs and engine.clock.name == "virtual"
                and isinstance(engine.backend, SimBackend)
                and isinstance(engine.scheduler, SteadyDecodes)
                and engine.backend.speculative is None)   # (a draft changes each step's shape)

    def __init__(self, engine: ServingEngine) -> None:
        self.engine = engine
        self.run: DecodeRun | None = None     # the run in progress, and its offset
        self.offset = 0
        self.last: StepRecord | None = None   # the last engine step, until a run starts from it
        self.num_steps = 0                    # steps computed here, over the whole run

    def after_step(self, out: StepRecord | Idle) -> None:
        """An engine step ran (or found nothing to do): a run may start from it, if it is steady."""
        self.run, self.offset, self.last = None, 0, None if isinstance(out, Idle) else out

    def _start_run(self) -> DecodeRun | None:
        """A run anchored at the last engine step, if every chunk of it sampled and nobody ended."""
        step, self.last = self.last, None
        if not all(c.samples for c in step.chunks):
            return None
        requests = [self.engine.requests[c.request_id] for c in step.chunks]
        if not all(r.status is RequestStatus.RUNNING for r in requests):
            return None
        return DecodeRun(step, requests)

    def advance(self, now: float, next_arrival: float | None) -> float | None:
        """Compute the steady decode steps from ``now`` until the next arrival, the first finish
        or a block shortage; return the new ``now``, or None if no step can be predicted."""
        engine = self.engine
        run = self.current_run()
        if run is None or not self._steady(run):
            return None
        max_offset = self.offset + self._steps_with_room(run)
        if max_offset == self.offset:
            return None
        stop_at = float("inf") if next_arrival is None else next_arrival
        records = predict_decode_steps(run, self.offset, now, stop_at, max_offset,
                                       len(engine.steps), engine.backend.step_duration)
        engine.steps.extend(records)
        self._bring_forward(run, records)
        self.num_steps += len(records)
        return records[-1].end

    def current_run(self) -> DecodeRun | None:
        """The run in progress, or one that starts from the last engine step if that is steady."""
        last = self.last
        if self.run is None and last is not None and self.engine.scheduler.decodes_steadily(
                tuple([c.request_id for c in last.chunks]), last.held_slots, last.batch_id):
            self.run = self._start_run()
        return self.run

    def _steady(self, run: DecodeRun) -> bool:
        """The policy's promise, asked again before each stretch of the run."""
        return self.engine.scheduler.decodes_steadily(run.request_ids, run.held_slots, run.batch_id)

    def _steps_with_room(self, run: DecodeRun) -> int:
        """Steps from ``offset`` to the run's first finish that the KV room allows."""
        steps_to_finish = run.last_offset - self.offset
        return self.engine.scheduler.decode_steps_with_room(run.request_ids, steps_to_finish)

    def _bring_forward(self, run: DecodeRun, records: list[StepRecord]) -> None:
        """Each request of ``run`` computed one token and got one (a placeholder) per step; those
        that produced their last token end (the engine applies them, as in a step)."""
        self.engine.scheduler.grow_for_decode_steps(run.request_ids, len(records))
        apply_decode_run(self.engine, run.requests, PLACEHOLDER_TOKEN, [s.end for s in records])
        self.offset += len(records)
        if self.offset == run.last_offset:
            self.run = None


def apply_decode_run(engine: ServingEngine, requests: list[Request], token: int,
                     ends: list[float]) -> None:
    """What the steps of a predicted run would have applied: each request computed a token and
    sampled ``token`` per step, the steps ending at ``ends``; who is done ends (``end_request``)
    and is released at the last end."""
    k, t, ended = len(ends), ends[-1], False
    for req in requests:
        req.num_computed_tokens += k
        req.output_ids.extend([token] * k)
        req.token_times.extend(ends)
        reason = req.ends_on(token)
        if reason is not None:
            engine.end_request(req, reason, t)
            ended = True
    if ended:
        engine.release_ended(t)


__all__ = ["DecodeRun", "DecodeRuns", "apply_decode_run", "predict_decode_steps"]
