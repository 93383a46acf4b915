"""What a scheduler hands the engine each step, and the features of a step that its cost depends on.

One rule for every step (vLLM v1's): a step plan is a list of (request, number of new tokens to
compute). A prompt chunk is ``num_tokens > 1`` (or the whole short prompt), a decode is exactly
1. Prefill and decode are then the same operation, and chunked prefill is just a smaller number.

The KV space a scheduler plans against is in ``batchlab.kv_space``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Iterable, Iterator, Sequence


@dataclass(slots=True)
class ScheduledChunk:
    """Compute tokens ``[start, start + num_tokens)`` of one request in this step.

    ``samples`` is True when this chunk reaches the request's last known token, so the step
    produces the request's next token (the final prompt chunk, or any decode).

    ``draft``: speculative decoding's drafted tokens, which follow the known tokens: the chunk's
    last ``len(draft)`` tokens (``num_tokens`` counts them). A decode with a draft of ``k`` tokens
    computes ``1 + k`` positions, and the step checks each draft token against the model's choice
    at the position before it (``batchlab.model.verify``), so it may produce up to ``k + 1``
    tokens. Only a sampling chunk drafts.

    Treat a chunk as read-only once planned. (It is not a frozen dataclass only because a
    simulation creates millions of them, and a frozen one takes three times longer to make.)
    """

    request_id: str
    start: int
    num_tokens: int
    samples: bool
    draft: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.start < 0:
            raise ValueError(f"chunk for {self.request_id!r}: start={self.start}; must be >= 0")
        if self.num_tokens < 1:
            raise ValueError(f"chunk for {self.request_id!r}: num_tokens={self.num_tokens}; "
                             "must be >= 1")
        if self.draft and (not self.samples or len(self.draft) >= self.num_tokens):
            raise ValueError(f"chunk for {self.request_id!r}: a draft of {len(self.draft)} tokens "
                             "needs a sampling chunk of more tokens "
                             f"(num_tokens={self.num_tokens}, samples={self.samples})")

    @property
    def is_decode(self) -> bool:
        """One known token (and any drafted ones after it) of a request past its prompt."""
        return self.num_tokens == 1 + len(self.draft) and self.start > 0 and self.samples


class DecodeChunks(Sequence):
    """The chunks of a step in which every sequence decodes one token: a compact, read-only list.

    Sequence ``j`` decodes position ``starts[j] + offset``. It behaves like the list of
    ``ScheduledChunk`` a scheduler would return (same items, same order; compares equal to it)
    but builds chunk objects only when they are read. The simulator's fast path
    (``batchlab.sim.fast_path``) records millions of such steps.
    """

    __slots__ = ("request_ids", "starts", "offset")

    def __init__(self, request_ids: tuple[str, ...], starts: tuple[int, ...], offset: int) -> None:
        self.request_ids = request_ids
        self.starts = starts
        self.offset = offset

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(self)[i]
        return ScheduledChunk(self.request_ids[i], self.starts[i] + self.offset, 1, True)

    def __iter__(self) -> Iterator[ScheduledChunk]:
        off = self.offset
        for rid, start in zip(self.request_ids, self.starts):
            yield ScheduledChunk(rid, start + off, 1, True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        n = len(self)
        return f"DecodeChunks({n} decode{'' if n == 1 else 's'} at offset {self.offset})"


def chunk_counts(chunks: Iterable[ScheduledChunk]) -> tuple[int, int, int]:
    """``(num_tokens, num_prefill_tokens, num_decode_seqs)`` of one step's chunks."""
    num_tokens = num_prefill = num_decode = 0
    for c in chunks:
        num_tokens += c.num_tokens
        if c.is_decode:
            num_decode += 1
        else:
            num_prefill += c.num_tokens
    return num_tokens, num_prefill, num_decode


class ChunkCounts:
    """Sizes of a step, counted from its ``chunks``."""

    chunks: Sequence[ScheduledChunk]

    @property
    def num_seqs(self) -> int:
        return len(self.chunks)

    @property
    def num_tokens(self) -> int:
        return chunk_counts(self.chunks)[0]

    @property
    def num_prefill_tokens(self) -> int:
        return chunk_counts(self.chunks)[1]

    @property
    def num_decode_seqs(self) -> int:
        return chunk_counts(self.chunks)[2]


@dataclass
class StepPlan(ChunkCounts):
    """One step's work. An empty plan means "nothing to run now".

    ``wake_at``: when the plan is empty, the earliest time at which the scheduler may have work
    even with no new arrival (a dynamic batcher's timer); ``None`` if only an arrival can help.
    ``held_slots``: batch slots held by members that have finished but whose batch has not
    (request-level batching). batchlab's kernel computes nothing for them, but a padded
    implementation would; the count shows that waste.
    ``batch_id``: which request-level batch this step belongs to (``None`` for continuous).
    """

    chunks: Sequence[ScheduledChunk] = field(default_factory=list)
    wake_at: float | None = None
    held_slots: int = 0
    batch_id: int | None = None

    @property
    def is_empty(self) -> bool:
        return not self.chunks


@dataclass(frozen=True)
class Idle:
    """What ``Engine.step`` returns when the scheduler planned nothing: when it may have work
    again without a new arrival (a dynamic batcher's timer), or None."""

    wake_at: float | None


# --- features of one step ----------------------------------------------------------------------
def chunk_attention_pairs(start: int, num_tokens: int) -> int:
    """Query-key pairs for computing tokens ``[start, start + num_tokens)`` of one sequence.

    Query ``start + j`` attends to ``start + j + 1`` keys, so the sum over ``j`` is
    ``num_tokens * start + num_tokens * (num_tokens + 1) / 2`` (a decode at ``p``: ``p + 1``).
    """
    return num_tokens * start + num_tokens * (num_tokens + 1) // 2


def decode_split(chunks: Iterable[ScheduledChunk]) -> tuple[int, int]:
    """``(decode_seqs, decode_pairs)``: the one-token chunks of a step and their query-key pairs
    (the rest are prompt chunks, whose pairs reuse each key across a tile of queries)."""
    seqs = pairs = 0
    for c in chunks:
        if c.num_tokens == 1:
            seqs += 1
            pairs += c.start + 1
    return seqs, pairs


def step_features(chunks: Iterable[ScheduledChunk]) -> tuple[int, int, int]:
    """``(num_seqs, num_tokens, attention_pairs)`` of one step's chunks (all exact integers)."""
    num_seqs = num_tokens = pairs = 0
    for c in chunks:
        num_seqs += 1
        num_tokens += c.num_tokens
        pairs += chunk_attention_pairs(c.start, c.num_tokens)
    return num_seqs, num_tokens, pairs
