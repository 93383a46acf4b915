"""The simulator's fast path: runs of plain decode steps predicted in bulk, with the offline driver.

Most steps of a large simulation are plain decode steps that repeat with every sequence one
token further on, until a request arrives or finishes. When the policy's own rules say that the
next steps can only be such decodes (``steady``, below), the offline driver lets this module
compute a whole run of them: one duration per step from the cost model, each step's chunks stored
compactly (``DecodeChunks``, expanded only when read), and the requests and the KV accounting
brought forward at once. The trace is the same as stepping the engine every time
(``tests/test_engine.py`` checks it); only the Python work per decode token disappears. It
applies only to the simulator (``SimBackend``) on the virtual clock.

When is a run steady? After a step in which every chunk sampled a token and nobody finished:

- **Continuous batching**: that step held every running request, in running order (so each now
  decodes, in the order ``schedule`` lists them), and the head of the waiting queue cannot be
  admitted (the running list is full, the decodes use the whole token budget, or it does not
  fit the KV space). None of that changes before a request arrives or finishes: no KV space is
  freed, and the number of decodes stays the same. On a paged cache every decode may need a new
  block: the run stops before the step in which the free blocks would run out (the scheduler
  would preempt someone), and it is not taken while the head of the queue could reuse cached
  prefix blocks that the run's new blocks might evict.
- **Static and dynamic batching**: a batch is running and that step was its latest: until a
  member finishes, each next step is one decode per unfinished member; arrivals only queue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from batchlab.backends.simulator import PLACEHOLDER_TOKEN, SimBackend
from batchlab.kv_blocks import BlockManager
from batchlab.plan import DecodeChunks, Idle, chunk_attention_pairs
from batchlab.requests import FinishReason, Request, RequestStatus
from batchlab.schedulers import ContinuousBatcher, RequestLevelBatcher
from batchlab.trace import StepRecord

if TYPE_CHECKING:
    from batchlab.engine import Engine


class DecodeRun:
    """A set of sequences decoding together, anchored at a step in which each of them sampled.

    That step is offset 0. At offset ``i`` every sequence decodes position ``starts[j] + i``,
    where ``starts[j]`` is the last position it computed at offset 0 (a decode's own position,
    or a completed prompt's last one). ``remaining[j]`` is how many more tokens sequence ``j``
    may produce after offset 0, so the run lasts at most ``min(remaining)`` steps: in that step
    the first sequence finishes.
    """

    __slots__ = ("request_ids", "starts", "requests", "remaining", "last_offset", "base_attention_pairs",
                 "held_slots", "batch_id")

    def __init__(self, step: StepRecord, requests: list[Request]) -> None:
        self.request_ids = tuple([r.request_id for r in requests])
        self.starts = tuple([c.start + c.num_tokens - 1 for c in step.chunks])
        self.requests = requests
        self.held_slots, self.batch_id = step.held_slots, step.batch_id
        # A request whose stop tokens include the placeholder stops at its next token.
        self.remaining = [1 if PLACEHOLDER_TOKEN in r.stop_token_ids else r.max_new_tokens - len(r.output_ids)
                          for r in requests]
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
                         first_index: int, step_duration: Callable[[int, int, int], float]) -> list[StepRecord]:
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


def steps_before_blocks_run_out(held_tokens: Sequence[int], block_size: int, free_blocks: int) -> int:
    """Decode steps (one token per sequence each) the sequences can take before a new block is
    needed and none is free. A sequence holding ``h`` tokens takes a block in every step that
    writes a position ``h + i - 1`` at the start of a block: first at step ``(-h) % block_size + 1``,
    then every ``block_size`` steps; each cycle of ``block_size`` steps takes one block each."""
    counts = [0] * block_size        # counts[r]: sequences whose next block comes at step r + 1
    for h in held_tokens:
        counts[(-h) % block_size] += 1
    cycles, left = divmod(free_blocks, len(held_tokens))
    for r, count in enumerate(counts):
        if count > left:
            return cycles * block_size + r
        left -= count
    return cycles * block_size + block_size     # not reached: the counts add up to more than left


def steady(scheduler, request_ids: tuple[str, ...], held_slots: int, batch_id: int | None) -> bool:
    """Do the policy's rules say that the next steps are one decode for each of ``request_ids``,
    until a request arrives or finishes? (The module docstring gives the rules.)"""
    if isinstance(scheduler, RequestLevelBatcher):
        return (bool(scheduler.unfinished) and batch_id == scheduler.current_batch_id
                and len(request_ids) == len(scheduler.unfinished))
    running = scheduler.running
    if len(request_ids) != len(running) or request_ids != tuple([r.request_id for r in running]):
        return False
    waiting, config = scheduler.waiting, scheduler.config
    if not waiting or len(running) >= config.max_num_seqs:
        return True
    head = waiting[0]
    if scheduler.first_chunk_tokens(head, config.max_num_batched_tokens - len(running)):
        return False
    return not _may_revive_cached_blocks(scheduler.kv, head)


def _may_revive_cached_blocks(kv, head: Request) -> bool:
    """Could the head of the queue hit cached blocks that nobody holds (so that a run's new blocks,
    by evicting them, could change whether it fits)?"""
    if not isinstance(kv, BlockManager) or not kv.enable_prefix_caching:
        return False
    return any(kv.ref_count[b] == 0 for b in kv.prefix_hits(head.prompt_ids, head.num_known_tokens - 1))


class DecodeRuns:
    """The fast path as the offline driver uses it: ``after_step`` after every engine step, then
    ``advance`` before the next one, which computes a run of steps when one is steady."""

    @staticmethod
    def applies(engine: "Engine") -> bool:
        return (engine.fast_decode_runs and engine.clock.name == "virtual"
                and isinstance(engine.backend, SimBackend)
                and isinstance(engine.scheduler, (ContinuousBatcher, RequestLevelBatcher)))

    def __init__(self, engine: "Engine") -> None:
        self.engine = engine
        self.grows = isinstance(engine.scheduler, ContinuousBatcher)   # it grows KV every step
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
        if run is None or not steady(engine.scheduler, run.request_ids, run.held_slots, run.batch_id):
            return None
        max_offset = min(run.last_offset, self.offset + self._steps_kv_allows(run))
        if max_offset == self.offset:
            return None
        stop_at = float("inf") if next_arrival is None else next_arrival
        records = predict_decode_steps(run, self.offset, now, stop_at, max_offset, len(engine.steps),
                                       engine.backend.step_duration)
        engine.steps.extend(records)
        self._bring_forward(run, records)
        self.offset += len(records)
        self.num_steps += len(records)
        t = records[-1].end
        if self.offset == run.last_offset:
            self._finish(run, t)
        return t

    def current_run(self) -> DecodeRun | None:
        """The run in progress, or one that starts from the last engine step if that is steady."""
        if self.run is None and self.last is not None and self._steady(self.last):
            self.run = self._start_run()
        return self.run

    def _steady(self, step: StepRecord) -> bool:
        """The policy's promise, asked before a run is built for ``step``."""
        ids = tuple([c.request_id for c in step.chunks])
        return steady(self.engine.scheduler, ids, step.held_slots, step.batch_id)

    def _steps_kv_allows(self, run: DecodeRun) -> int:
        kv = self.engine.scheduler.kv
        if not (self.grows and isinstance(kv, BlockManager)):
            return run.last_offset
        # Plenty of free blocks (each sequence's growth to the run's end, plus one): no count needed.
        if kv.num_free_blocks >= run.num_seqs * ((run.last_offset - self.offset) // kv.block_size + 2):
            return run.last_offset
        held = [kv.num_tokens_of[rid] for rid in run.request_ids]
        return steps_before_blocks_run_out(held, kv.block_size, kv.num_free_blocks)

    def _bring_forward(self, run: DecodeRun, records: list[StepRecord]) -> None:
        """Each request of ``run`` computed one token and got one (a placeholder) per step."""
        k, ends = len(records), [s.end for s in records]
        kv, tokens = self.engine.scheduler.kv, [PLACEHOLDER_TOKEN] * k
        for req in run.requests:
            if self.grows and not kv.grow(req.request_id, k):
                raise AssertionError(f"{req.request_id!r} could not grow by {k}: the run was sized to fit")
            req.num_computed_tokens += k
            req.output_ids.extend(tokens)
            req.token_times.extend(ends)

    def _finish(self, run: DecodeRun, t: float) -> None:
        """The run's last step: the requests that produced their last token end."""
        for req, remaining in zip(run.requests, run.remaining):
            if remaining == self.offset:
                stopped = req.output_ids[-1] in req.stop_token_ids
                self.engine.end_request(req, FinishReason.STOP if stopped else FinishReason.LENGTH, t)
        self.engine.release(self.engine.scheduler.remove_ended(), t)
        self.run = None


__all__ = ["DecodeRun", "DecodeRuns", "predict_decode_steps", "steady", "steps_before_blocks_run_out"]
