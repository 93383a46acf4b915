"""The KV-space accounting a scheduler plans against: sizes and reservations, never tensors.

A request is admitted only when the cache can hold everything it may ever need
(``prompt_len + max_new_tokens``). batchlab reserves that up front at admission, so a running
request never runs out of cache and no preemption is needed. (vLLM grows a request's blocks as
it decodes and preempts when memory runs out; reserving is simpler and easy to reason about, at
the price of admitting fewer requests when ``max_new_tokens`` is generous.)

Two implementations: the real model's ``KVCache`` (``batchlab.model.kv_cache``, slots of
tensors) and the simulator's ``TokenKVSpace`` (below, accounting only).
"""

from __future__ import annotations

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


class KVCacheFullError(RuntimeError):
    """Raised when a sequence is allocated without room; schedulers check ``can_allocate`` first."""


class TokenKVSpace:
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
