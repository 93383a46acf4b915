"""The KV cache: where each running sequence keeps the keys and values of its past tokens.

Layout: one slot per sequence, each slot long enough for ``max_seq_len`` tokens::

    kv: (num_layers, num_slots, 2, num_kv_heads, max_seq_len, head_dim)   # [:, :, 0] keys, [:, :, 1] values

Keys and values share one tensor so a step writes both with one indexed copy per layer.

A sequence is given a whole slot when it is admitted and gives it back when it finishes; the
slot is reused by the next admitted sequence at the very next step. Because a slot's tokens are
contiguous, attention reads a sequence's past as a plain view (no gather, no copy), and a
decode step can attend for many slots in one call.

The price of slots is memory: a sequence that ends after 50 tokens still held room for
``max_seq_len``. ``reserved_tokens`` (what admitted sequences may really use) against
``used_tokens`` (what their slots hold) measures that waste. Paged caches (vLLM's
PagedAttention) hand out small blocks instead; the scheduler-facing ``KVSpace`` interface
(can_allocate / allocate / free) is the same, so one could replace this class without touching
any scheduler.
"""

from __future__ import annotations

import torch

from batchlab.checks import check_int
from batchlab.kv_space import KVCacheFullError, ReservingKVSpace

DTYPE_BYTES = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}


class KVCache(ReservingKVSpace):
    """A slot-per-sequence KV cache that implements the schedulers' ``KVSpace`` accounting."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_slots: int,
                 max_seq_len: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> None:
        for name, value in [("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim), ("num_slots", num_slots), ("max_seq_len", max_seq_len)]:
            check_int(name, value)
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype={dtype!r}; allowed: {list(DTYPE_BYTES)}")
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.num_slots, self.max_seq_len = num_slots, max_seq_len
        self.kv = torch.zeros((num_layers, num_slots, 2, num_kv_heads, max_seq_len, head_dim),
                              dtype=dtype, device=device)
        self._free_slots = list(range(num_slots))        # kept sorted: lowest slot first
        self._slot_of: dict[str, int] = {}
        self._reserved_of: dict[str, int] = {}

    @classmethod
    def from_budget(cls, memory_bytes: int, max_seq_len: int, num_layers: int, num_kv_heads: int,
                    head_dim: int, dtype: torch.dtype = torch.float32, device: str = "cpu",
                    max_slots: int | None = None) -> "KVCache":
        """As many slots of ``max_seq_len`` tokens as ``memory_bytes`` holds (at most ``max_slots``)."""
        per_token = cls.token_bytes(num_layers, num_kv_heads, head_dim, dtype)
        slots = int(memory_bytes // (per_token * max_seq_len))
        if max_slots is not None:
            slots = min(slots, max_slots)
        if slots < 1:
            raise ValueError(
                f"memory_bytes={memory_bytes:,} cannot hold one sequence of max_seq_len={max_seq_len} "
                f"tokens ({per_token * max_seq_len:,} bytes); give more memory or a shorter max_seq_len")
        return cls(num_layers, num_kv_heads, head_dim, slots, max_seq_len, dtype, device)

    @staticmethod
    def token_bytes(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes of cache one token needs: a key and a value per layer and KV head."""
        return 2 * num_layers * num_kv_heads * head_dim * DTYPE_BYTES[dtype]

    # --- sizes ---------------------------------------------------------------------------------
    @property
    def bytes_per_token(self) -> int:
        return self.token_bytes(self.num_layers, self.num_kv_heads, self.head_dim, self.kv.dtype)

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_token * self.capacity_tokens

    @property
    def capacity_tokens(self) -> int:
        return self.num_slots * self.max_seq_len

    @property
    def used_tokens(self) -> int:
        """Tokens held by admitted sequences' slots (whole slots)."""
        return len(self._slot_of) * self.max_seq_len

    @property
    def reserved_tokens(self) -> int:
        """Tokens admitted sequences may actually use (prompt + max_new_tokens each)."""
        return sum(self._reserved_of.values())

    # --- the KVSpace interface -------------------------------------------------------------------
    def fits_ever(self, num_tokens: int) -> bool:
        return 1 <= num_tokens <= self.max_seq_len

    def can_allocate(self, num_tokens: int) -> bool:
        return self.fits_ever(num_tokens) and bool(self._free_slots)

    def allocate(self, request_id: str, num_tokens: int) -> int:
        """Give ``request_id`` the lowest free slot (keeps busy slots packed at the front)."""
        if request_id in self._slot_of:
            raise ValueError(f"request {request_id!r} already holds slot {self._slot_of[request_id]}")
        if not self.fits_ever(num_tokens):
            raise KVCacheFullError(f"request {request_id!r} needs {num_tokens} tokens; a slot holds "
                                   f"1 to {self.max_seq_len}")
        if not self._free_slots:
            raise KVCacheFullError(f"request {request_id!r}: all {self.num_slots} KV slots are in use")
        slot = self._free_slots.pop(0)
        self._slot_of[request_id] = slot
        self._reserved_of[request_id] = num_tokens
        return slot

    def free(self, request_id: str) -> None:
        slot = self._slot_of.pop(request_id)
        del self._reserved_of[request_id]
        # Keep the free list sorted so allocation always takes the lowest slot.
        i = 0
        while i < len(self._free_slots) and self._free_slots[i] < slot:
            i += 1
        self._free_slots.insert(i, slot)

    def slot_of(self, request_id: str) -> int:
        try:
            return self._slot_of[request_id]
        except KeyError:
            raise KeyError(f"request {request_id!r} holds no KV slot; a scheduler must allocate "
                           "one before the request runs") from None

    def __repr__(self) -> str:
        return (f"KVCache({self.num_slots} slots x {self.max_seq_len} tokens, "
                f"{self.bytes_per_token:,} B/token, {self.total_bytes / 2**20:,.0f} MiB, "
                f"{len(self._slot_of)} in use)")
