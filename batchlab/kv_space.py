"""The KV contract a scheduler plans against (``KVSpace``): admit, grow, free, rollback; sizes,
never tensors.

Every cache answers the same calls: a reserving one (``ReservingKVSpace``: the slot cache,
``TokenKVSpace``) holds a sequence's whole length from admission; a paged one
(``kv_blocks.BlockManager``) grows block by block and may share prefix blocks. The rules and
their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from batchlab.checks import check_int


@runtime_checkable
class KVSpace(Protocol):
    """The KV-cache accounting a scheduler sees (see the module docstring)."""

    max_seq_len: int | None          # the longest sequence allowed (None: the whole cache)
    block_size: int | None           # tokens per block of a paged space (None: a reserving one)
    num_hit_tokens: int              # prompt tokens served from a prefix cache, over the run
    # True: a model's cache (keys, values; write_tokens); False: counts
    stores_values: bool

    @property
    def capacity_tokens(self) -> int: ...

    @property
    def used_tokens(self) -> int: ...

    def fits_ever(self, num_tokens: int) -> bool:
        """Could a sequence of ``num_tokens`` fit in an empty cache? (False: reject it.)"""

    def cached_prefix_tokens(self, prompt_ids: Sequence[int] | None, max_tokens: int) -> int:
        """Leading prompt tokens whose KV is already cached (at most ``max_tokens``); 0 if none."""

    def can_admit(self, num_tokens: int, max_tokens: int,
                  prompt_ids: Sequence[int] | None = None) -> bool:
        """Could a new sequence start now, computing ``num_tokens`` (cached prefix included) in
        its first step and growing to at most ``max_tokens``?"""

    def admit(self, request_id: str, num_tokens: int, max_tokens: int,
              prompt_ids: Sequence[int] | None = None) -> int:
        """Admit the sequence; return its cached prefix tokens. ``KVCacheFullError`` if it does
        not fit."""

    def can_grow(self, request_id: str, num_tokens: int) -> bool:
        """Could the sequence hold ``num_tokens`` more tokens than it has room for now?"""

    def grow(self, request_id: str, num_tokens: int) -> bool:
        """Give the sequence room for ``num_tokens`` more tokens; False (no change) if none."""

    def grow_each(self, request_ids: Sequence[str]) -> int:
        """``grow(id, 1)`` for each sequence in turn, stopping at the first with no room; returns
        how many grew (those after it are not grown)."""

    def rollback(self, request_id: str, num_tokens: int) -> None:
        """The sequence's last ``num_tokens`` tokens of room held drafted tokens its step rejected
        (speculative decoding): give that room back. Their keys and values are garbage now, and
        the next tokens at those positions overwrite them."""

    def free(self, request_id: str) -> None:
        """Release a sequence's space; it can be reused at the very next step."""


class ReservingKVSpace:
    """The contract for a space that reserves a sequence's whole length when it is admitted.

    A subclass says how much room it has (``fits_ever``, ``has_room_for``) and where a sequence's
    reservation goes (``_reserve``, ``_unreserve``); admission, growth within the reservation,
    and release are the same for all of them. Nothing is shared between sequences.
    """

    max_seq_len: int | None = None
    block_size: int | None = None      # not paged
    num_hit_tokens: int = 0            # nothing is shared
    stores_values: bool = False        # counts tokens; a model's cache says True

    def __init__(self) -> None:
        self._reserved: dict[str, int] = {}    # the tokens each sequence may use (its max_tokens)

    def has_room_for(self, num_tokens: int) -> bool:
        """Is there room now to reserve ``num_tokens`` more tokens?"""
        raise NotImplementedError

    def _reserve(self, request_id: str, num_tokens: int) -> None:
        """Set aside room for ``num_tokens`` tokens of a new sequence."""

    def _unreserve(self, request_id: str, num_tokens: int) -> None:
        """Give back what ``_reserve`` set aside."""

    def fits_ever(self, num_tokens: int) -> bool:
        raise NotImplementedError

    def cached_prefix_tokens(self, prompt_ids: Sequence[int] | None, max_tokens: int) -> int:
        return 0

    def can_admit(self, num_tokens: int, max_tokens: int,
                  prompt_ids: Sequence[int] | None = None) -> bool:
        return self.fits_ever(max_tokens) and self.has_room_for(max_tokens)

    def admit(self, request_id: str, num_tokens: int, max_tokens: int,
              prompt_ids: Sequence[int] | None = None) -> int:
        if request_id in self._reserved:
            raise ValueError(f"request {request_id!r} already holds KV space")
        if num_tokens > max_tokens or not self.can_admit(num_tokens, max_tokens):
            raise KVCacheFullError(f"request {request_id!r} needs {max_tokens} KV tokens; {self!r}")
        self._reserve(request_id, max_tokens)
        self._reserved[request_id] = max_tokens
        return 0

    # Growth is always granted: the sequence was admitted with room for every token it may ever
    # have (``max_tokens``), and the engine ends it there. Nothing to count, so nothing is done.
    def can_grow(self, request_id: str, num_tokens: int) -> bool:
        return True

    def grow(self, request_id: str, num_tokens: int) -> bool:
        return True

    def grow_each(self, request_ids: Sequence[str]) -> int:
        return len(request_ids)

    def rollback(self, request_id: str, num_tokens: int) -> None:
        """Nothing to give back: the reservation covers the sequence's whole length."""

    def free(self, request_id: str) -> None:
        try:
            num_tokens = self._reserved.pop(request_id)
        except KeyError:
            raise KeyError(f"request {request_id!r} holds no KV space (freed twice?)") from None
        self._unreserve(request_id, num_tokens)


class KVCacheFullError(RuntimeError):
    """Raised when a sequence is admitted or grown without room; schedulers ask ``can_admit`` and
    ``can_grow`` first."""


class TokenKVSpace(ReservingKVSpace):
    """Accounting-only KV space of ``capacity_tokens`` tokens (the simulator's reserving cache)."""

    def __init__(self, capacity_tokens: int, max_seq_len: int | None = None) -> None:
        check_int("capacity_tokens", capacity_tokens)
        check_int("max_seq_len", max_seq_len, allow_none=True)
        super().__init__()
        self._capacity = capacity_tokens
        self.max_seq_len = max_seq_len
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

    def has_room_for(self, num_tokens: int) -> bool:
        return self._used + num_tokens <= self._capacity

    def _reserve(self, request_id: str, num_tokens: int) -> None:
        self._used += num_tokens

    def _unreserve(self, request_id: str, num_tokens: int) -> None:
        self._used -= num_tokens

    def __repr__(self) -> str:
        return (f"TokenKVSpace(used={self._used}/{self._capacity} tokens, "
                f"seqs={len(self._reserved)})")
