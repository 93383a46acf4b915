"""What a scheduler hands the engine each step, and the KV-space accounting it plans against.

One rule for every step (vLLM v1's): a step plan is a list of (request, number of new tokens to
compute). A prompt chunk is ``num_tokens > 1`` (or the whole short prompt), a decode is exactly
1. Prefill and decode are then the same operation, and chunked prefill is just a smaller number.

KV space, two kinds behind one interface (``KVSpace``):

- **Reserving** (``grows_on_demand = False``: the slot cache ``kv_cache.KVCache`` and the
  simulator's ``TokenKVSpace``): a request is admitted only when the cache can hold everything
  it may ever need (``prompt_len + max_new_tokens``), reserved up front, so a running request
  never runs out of cache and no preemption is needed. Simple to reason about, at the price of
  admitting fewer requests when ``max_new_tokens`` is generous.
- **Paged** (``grows_on_demand = True``: ``kv_blocks.BlockManager``, and
  ``paged_kv_cache.PagedKVCache`` on the real model): admission takes blocks for the first
  step only; before each step the scheduler asks ``can_grow`` / ``grow`` for the step's new
  tokens, and preempts a request when memory runs out (as vLLM does). It may also find a
  prompt's first blocks already cached (``cached_prefix_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable


@dataclass(slots=True)
class ScheduledChunk:
    """Compute tokens ``[start, start + num_tokens)`` of one request in this step.

    ``samples`` is True when this chunk reaches the request's last known token, so the step
    produces the request's next token (the final prompt chunk, or any decode).

    Treat a chunk as read-only once planned. (It is not a frozen dataclass only because a
    simulation creates millions of them, and a frozen one takes three times longer to make.)
    """

    request_id: str
    start: int
    num_tokens: int
    samples: bool

    def __post_init__(self) -> None:
        if self.start < 0:
            raise ValueError(f"chunk for {self.request_id!r}: start={self.start}; must be >= 0")
        if self.num_tokens < 1:
            raise ValueError(f"chunk for {self.request_id!r}: num_tokens={self.num_tokens}; must be >= 1")

    @property
    def is_decode(self) -> bool:
        return self.num_tokens == 1 and self.start > 0 and self.samples


class ChunkCounts:
    """Sizes of a step, counted from its ``chunks`` (shared by ``StepPlan`` and ``StepRecord``)."""

    chunks: Sequence[ScheduledChunk]

    @property
    def num_seqs(self) -> int:
        return len(self.chunks)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks if not c.is_decode)

    @property
    def num_decode_seqs(self) -> int:
        return sum(1 for c in self.chunks if c.is_decode)


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

    chunks: list[ScheduledChunk] = field(default_factory=list)
    wake_at: float | None = None
    held_slots: int = 0
    batch_id: int | None = None

    @property
    def is_empty(self) -> bool:
        return not self.chunks


@runtime_checkable
class KVSpace(Protocol):
    """The KV-cache accounting a scheduler may see: sizes and reservations, never tensors."""

    def can_allocate(self, num_tokens: int) -> bool:
        """Could a new sequence needing ``num_tokens`` cache slots be admitted now?"""

    def allocate(self, request_id: str, num_tokens: int) -> None:
        """Reserve space for a sequence; raises ``KVCacheFullError`` when it does not fit."""

    def free(self, request_id: str) -> None:
        """Release a sequence's space; it can be reused at the very next step."""

    def fits_ever(self, num_tokens: int) -> bool:
        """Could a sequence of ``num_tokens`` fit in an empty cache? (False → reject it.)"""

    @property
    def capacity_tokens(self) -> int: ...

    @property
    def used_tokens(self) -> int: ...

    # Paged growth (see the module docstring). Reserving spaces get these from ``ReservingKVSpace``.
    grows_on_demand: bool

    def can_grow(self, request_id: str, num_tokens: int) -> bool:
        """Could the sequence hold ``num_tokens`` more tokens than it has room for now?"""

    def grow(self, request_id: str, num_tokens: int) -> None:
        """Give the sequence room for ``num_tokens`` more tokens; ``KVCacheFullError`` if none."""

    def cached_prefix_tokens(self, prompt_ids: Sequence[int] | None, max_tokens: int) -> int:
        """Leading prompt tokens whose KV is already cached (at most ``max_tokens``); 0 if none."""


class ReservingKVSpace:
    """The paged-growth part of ``KVSpace`` for a space that reserves whole lengths at admission.

    Such a space already holds room for every token a sequence may need, so growing within the
    reservation always succeeds and changes nothing, and nothing is shared between sequences.
    Schedulers only call these on a space whose ``grows_on_demand`` is True.
    """

    grows_on_demand = False

    def can_grow(self, request_id: str, num_tokens: int) -> bool:
        return True

    def grow(self, request_id: str, num_tokens: int) -> None:
        return None

    def cached_prefix_tokens(self, prompt_ids: Sequence[int] | None, max_tokens: int) -> int:
        return 0


class KVCacheFullError(RuntimeError):
    """Raised when a sequence is allocated without room; schedulers check ``can_allocate`` first."""


class TokenKVSpace(ReservingKVSpace):
    """Accounting-only KV space of ``capacity_tokens`` tokens (the simulator's cache)."""

    def __init__(self, capacity_tokens: int, max_seq_len: int | None = None) -> None:
        if not isinstance(capacity_tokens, int) or capacity_tokens < 1:
            raise ValueError(f"capacity_tokens={capacity_tokens!r}; must be an int >= 1")
        if max_seq_len is not None and (not isinstance(max_seq_len, int) or max_seq_len < 1):
            raise ValueError(f"max_seq_len={max_seq_len!r}; must be an int >= 1 or None")
        self._capacity = capacity_tokens
        self.max_seq_len = max_seq_len
        self._reserved: dict[str, int] = {}
        self._used = 0

    @property
    def capacity_tokens(self) -> int:
        return self._capacity

    @property
    def used_tokens(self) -> int:
        return self._used

    def fits_ever(self, num_tokens: int) -> bool:
        if self.max_seq_len is not None and num_tokens > self.max_seq_len:
            return False
        return num_tokens <= self._capacity

    def can_allocate(self, num_tokens: int) -> bool:
        return self.fits_ever(num_tokens) and self._used + num_tokens <= self._capacity

    def allocate(self, request_id: str, num_tokens: int) -> None:
        if request_id in self._reserved:
            raise ValueError(f"request {request_id!r} already holds KV space")
        if not self.can_allocate(num_tokens):
            raise KVCacheFullError(
                f"request {request_id!r} needs {num_tokens} KV tokens; {self._capacity - self._used} "
                f"of {self._capacity} are free")
        self._reserved[request_id] = num_tokens
        self._used += num_tokens

    def free(self, request_id: str) -> None:
        self._used -= self._reserved.pop(request_id)

    def __repr__(self) -> str:
        return f"TokenKVSpace(used={self._used}/{self._capacity} tokens, seqs={len(self._reserved)})"
