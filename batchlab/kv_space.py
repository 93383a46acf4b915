"""The KV-space accounting a scheduler plans against: sizes and reservations, never tensors.

Two kinds behind one interface (``KVSpace``):

- **Reserving** (``grows_on_demand = False``: the slot cache ``batchlab.model.kv_cache.KVCache``
  and the simulator's ``TokenKVSpace`` below): a request is admitted only when the cache can
  hold everything it may ever need (``prompt_len + max_new_tokens``), reserved up front, so a
  running request never runs out of cache and no preemption is needed. Simple to reason about,
  at the price of admitting fewer requests when ``max_new_tokens`` is generous.
- **Paged** (``grows_on_demand = True``: ``batchlab.kv_blocks.BlockManager``, and
  ``batchlab.model.paged_kv_cache.PagedKVCache`` on the real model): admission takes blocks for
  the first step only; before each step the scheduler asks ``can_grow`` / ``grow`` for the
  step's new tokens, and preempts a request when memory runs out (as vLLM does). It may also
  find a prompt's first blocks already cached (``cached_prefix_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from batchlab.checks import check_int


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
        check_int("capacity_tokens", capacity_tokens)
        check_int("max_seq_len", max_seq_len, allow_none=True)
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
