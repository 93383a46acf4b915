"""The simulator's fast path: runs of plain decode steps predicted in bulk.

Most steps of a large simulation are plain decode steps that repeat with every sequence one
token further on, until a request arrives or finishes. When the scheduler promises exactly that
(``Scheduler.continues_decoding``) and the backend declares that it can predict a step from its
size alone (``Backend.predicts_decode_runs``, as ``SimBackend`` does), the engine lets this
module compute such a run of steps: one duration per step from the cost model, each step's
chunks stored compactly (``DecodeChunks``, expanded only when read). The trace is the same as
calling the scheduler every step (``tests/test_engine.py`` checks it); only the Python work per
decode token disappears.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from batchlab.plan import DecodeChunks, ScheduledChunk, chunk_attention_pairs
from batchlab.requests import Request
from batchlab.trace import StepRecord


class DecodeRun:
    """A set of sequences decoding together, anchored at a step in which each of them sampled.

    That step is offset 0. At offset ``i`` every sequence decodes position ``starts[j] + i``,
    where ``starts[j]`` is the last position it computed at offset 0 (a decode's own position,
    or a completed prompt's last one). ``remaining[j]`` is how many more tokens sequence ``j``
    may produce after offset 0, so the run lasts at most ``min(remaining)`` steps: in that step
    the first sequence finishes.
    """

    __slots__ = ("request_ids", "starts", "requests", "remaining", "last_offset", "base_attention_pairs")

    def __init__(self, chunks: Sequence[ScheduledChunk], by_id: Mapping[str, Request], placeholder: int) -> None:
        self.request_ids = tuple([c.request_id for c in chunks])
        self.starts = tuple([c.start + c.num_tokens - 1 for c in chunks])
        self.requests = requests = [by_id[rid] for rid in self.request_ids]
        # A request whose stop tokens include the placeholder stops at its next token.
        self.remaining = [
            1 if r.stop_token_ids and placeholder in r.stop_token_ids else r.max_new_tokens - len(r.output_ids)
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


def predict_decode_steps(run: DecodeRun, offset: int, now: float, stop_at: float, first_index: int,
                         step_duration: Callable[[int, int, int], float], held_slots: int,
                         batch_id: int | None) -> tuple[list[StepRecord], int]:
    """The steps after ``offset`` of ``run``, from ``now``, until the first sequence finishes or a
    step ends at or after ``stop_at`` (the next arrival). Returns the step records and the last
    offset reached. ``step_duration(num_seqs, num_tokens, attention_pairs)`` is the backend's."""
    num_seqs = run.num_seqs
    last_offset = run.last_offset
    pairs = run.base_attention_pairs + num_seqs * offset
    records: list[StepRecord] = []
    index = first_index
    t = now
    while True:
        offset += 1
        pairs += num_seqs
        duration = step_duration(num_seqs, num_seqs, pairs)
        records.append(StepRecord(index, t, duration, run.chunks_at(offset), held_slots, batch_id))
        index += 1
        t += duration
        if offset == last_offset or t >= stop_at:
            return records, offset
