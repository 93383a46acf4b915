"""The KV cache: where each running sequence keeps the keys and values of its past tokens.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from batchlab.checks import check_int
from batchlab.kv_space import ReservingKVSpace
from batchlab.model.step_layout import StepLayout, chunk_attention, decode_attention, place_decodes
from batchlab.shapes import kv_bytes_per_token

CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_cache_shape(num_layers: int, num_kv_heads: int, head_dim: int,
                      dtype: torch.dtype) -> None:
    """The checks every KV cache's tensors share."""
    for name, value in [("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim)]:
        check_int(name, value)
    if dtype not in CACHE_DTYPES:
        raise ValueError(f"dtype={dtype!r}; must be one of {list(CACHE_DTYPES)}")


class KVCache(ReservingKVSpace):
    """A slot-per-sequence KV cache that implements the schedulers' ``KVSpace`` contract."""

    stores_values = True

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_slots: int,
                 max_seq_len: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> None:
        check_cache_shape(num_layers, num_kv_heads, head_dim, dtype)
        check_int("num_slots", num_slots)
        check_int("max_seq_len", max_seq_len)
        super().__init__()
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.num_slots, self.max_seq_len = num_slots, max_seq_len
        self.kv = torch.zeros((num_layers, 2, num_slots, num_kv_heads, max_seq_len, head_dim),
                              dtype=dtype, device=device)
        self._free_slots = list(range(num_slots))        # kept sorted: lowest slot first
        self._slot_of: dict[str, int] = {}
        self._holder: dict[int, str] = {}                # slot -> the request in it
        self._written = [0] * num_slots                  # positions written in each slot
        self._moves: list[tuple[int, int, int]] = []     # (from slot, to slot, positions) to copy

    @classmethod
    def from_budget(cls, memory_bytes: int, max_seq_len: int, num_layers: int, num_kv_heads: int,
                    head_dim: int, dtype: torch.dtype = torch.float32, device: str = "cpu",
                    max_slots: int | None = None) -> "KVCache":
        """As many slots of ``max_seq_len`` tokens as ``memory_bytes`` holds (at most
        ``max_slots``)."""
        per_token = cls.token_bytes(num_layers, num_kv_heads, head_dim, dtype)
        slots = int(memory_bytes // (per_token * max_seq_len))
        if max_slots is not None:
            slots = min(slots, max_slots)
        if slots < 1:
            raise ValueError(
                f"memory_bytes={memory_bytes:,} cannot hold one sequence of "
                f"max_seq_len={max_seq_len} tokens ({per_token * max_seq_len:,} bytes); "
                "give more memory or a shorter max_seq_len")
        return cls(num_layers, num_kv_heads, head_dim, slots, max_seq_len, dtype, device)

    @staticmethod
    def token_bytes(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes of cache one token needs (``batchlab.shapes.kv_bytes_per_token``)."""
        return kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype.itemsize)

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

    # --- the KVSpace contract (admission, growth and release: ReservingKVSpace) -----------------
    @property
    def block_size(self) -> int:
        """A slot is one block of ``max_seq_len`` consecutive positions."""
        return self.max_seq_len

    def fits_ever(self, num_tokens: int) -> bool:
        return 1 <= num_tokens <= self.max_seq_len

    def has_room_for(self, num_tokens: int) -> bool:
        return bool(self._free_slots)

    def _reserve(self, request_id: str, num_tokens: int) -> None:
        """Give ``request_id`` the lowest free slot (busy slots stay packed at the front)."""
        slot = self._free_slots.pop(0)
        self._slot_of[request_id], self._holder[slot], self._written[slot] = slot, request_id, 0

    def _unreserve(self, request_id: str, num_tokens: int) -> None:
        """Free the slot; the sequence in the highest busy slot moves into it, so the busy slots
        stay ``0..n-1``. Its past is copied at the start of the next step (``_apply_moves``)."""
        hole = self._slot_of.pop(request_id)
        del self._holder[hole]
        last = max(self._holder, default=-1)
        if last > hole:
            mover = self._holder.pop(last)
            self._slot_of[mover], self._holder[hole] = hole, mover
            self._moves.append((last, hole, self._written[last]))
            self._written[hole] = self._written[last]
            hole = last
        bisect.insort(self._free_slots, hole)                        # kept sorted

    def _apply_moves(self) -> None:
        """Copy the pasts of sequences moved by ``_unreserve``, in the order they moved."""
        for src, dst, n in self._moves:
            self.kv[:, :, dst, :, :n] = self.kv[:, :, src, :, :n]
        self._moves.clear()

    def block_table(self, request_id: str) -> list[int]:
        """The sequence's one block: its slot."""
        return [self.slot_of(request_id)]

    # --- what a step needs ----------------------------------------------------------------------
    def seq_chunk(self, request_id: str, start: int, token_ids: list[int], want_logits: bool,
                  num_logits: int = 1) -> "SeqChunk":
        """The step's view of one request's chunk: its slot."""
        return SeqChunk(self.slot_of(request_id), start, token_ids, want_logits, num_logits)

    def step_layout(self, chunks: list["SeqChunk"], config, device) -> "SlotStepLayout":
        self._apply_moves()
        return SlotStepLayout(chunks, self, config, device)

    def attention(self, q: torch.Tensor, kv_new: torch.Tensor, layer: int,
                  lay: "SlotStepLayout") -> torch.Tensor:
        return slot_attention(q, kv_new, self.kv[layer], lay)

    # --- a disaggregated hand-off: a sequence's keys and values, out and in ----------------------
    def read_tokens(self, request_id: str, num_tokens: int) -> torch.Tensor:
        """A copy of the sequence's first ``num_tokens`` positions:
        (layers, num_tokens, 2, KV, hd)."""
        slot = self.slot_of(request_id)
        # a moved sequence's past is where it went
        self._apply_moves()
        return self.kv[:, :, slot, :, :num_tokens].permute(0, 3, 1, 2, 4).contiguous()

    def write_tokens(self, request_id: str, kv: torch.Tensor) -> None:
        """Write ``kv`` (layers, n, 2, KV, hd), computed elsewhere, into positions ``0..n-1`` of
        the slot."""
        slot, n = self.slot_of(request_id), kv.shape[1]
        self._apply_moves()
        self.kv[:, :, slot, :, :n] = kv.permute(0, 2, 3, 1, 4)
        self._written[slot] = max(self._written[slot], n)

    def slot_of(self, request_id: str) -> int:
        try:
            return self._slot_of[request_id]
        except KeyError:
            raise KeyError(f"request {request_id!r} holds no KV slot; a scheduler must admit it "
                           "before it runs") from None

    def __repr__(self) -> str:
        return (f"KVCache({self.num_slots} slots x {self.max_seq_len} tokens, "
                f"{self.bytes_per_token:,} B/token, {self.total_bytes / 2**20:,.0f} MiB, "
                f"{len(self._slot_of)} in use)")


@dataclass(frozen=True)
class SeqChunk:
    """One sequence's part of a step: ``token_ids`` go to positions ``start, start+1, ...``
    in KV slot ``slot``; ``want_logits`` asks for the next-token logits after its last token
    (and after each of its last ``num_logits`` tokens: a speculative draft's check)."""

    slot: int
    start: int
    token_ids: list[int]
    want_logits: bool
    num_logits: int = 1       # with want_logits: logits after each of the last num_logits tokens


class SlotStepLayout(StepLayout):
    """A step's index tensors on the slot cache: each token's slot, and for the single-token chunks
    a mask over slots ``[0, span)`` that keeps each one to its own past (positions <= start)."""

    def __init__(self, chunks: list[SeqChunk], cache: KVCache, config, device) -> None:
        self.cache, self._seen_slots = cache, set()
        super().__init__(chunks, config, device)
        self.slots = torch.tensor([c.slot for c in chunks for _ in c.token_ids], dtype=torch.long,
                                  device=device)                                    # (T,)
        if self.single:
            single_slots = [c.slot for _, c in self.single]
            self.span = max(single_slots) + 1
            self.max_ctx = max(c.start for _, c in self.single) + 1
            self.single_slots = torch.tensor(single_slots, dtype=torch.long, device=device)
            # unused slots see 1 key
            lengths = torch.ones(self.span, dtype=torch.long, device=device)
            lengths[self.single_slots] = torch.tensor([c.start + 1 for _, c in self.single],
                                                      device=device)
            ctx = torch.arange(self.max_ctx, device=device)
            # (span, 1, 1, ctx)
            self.single_mask = (ctx[None, :] < lengths[:, None])[:, None, None, :]
            # Common case: decodes first, in slot order 0, 1, 2, ...: no scatter into slot order.
            self.dense = self.singles_first and single_slots == list(range(len(single_slots)))

    def describe(self, chunk: SeqChunk) -> str:
        return f"slot {chunk.slot}"

    def position_limit(self, chunk: SeqChunk) -> tuple[int, str]:
        return self.cache.max_seq_len, f"KV slot length {self.cache.max_seq_len}"

    def check(self, chunk: SeqChunk) -> None:
        if chunk.slot in self._seen_slots:
            raise ValueError(f"slot {chunk.slot} appears twice in one step")
        if not 0 <= chunk.slot < self.cache.num_slots:
            raise ValueError(f"slot={chunk.slot} is outside the cache's slots "
                             f"0..{self.cache.num_slots - 1}")
        self._seen_slots.add(chunk.slot)
        written = self.cache._written
        written[chunk.slot] = max(written[chunk.slot], chunk.start + len(chunk.token_ids))


def slot_attention(q: torch.Tensor, kv_new: torch.Tensor, kv_cache: torch.Tensor,
                   lay: SlotStepLayout) -> torch.Tensor:
    """One layer's attention on the slot cache: write the step's keys/values into each sequence's
    slot, then attend each token to its slot's past, read as a plain view (no copy).

    ``q``: (T, H, hd); ``kv_new``: (T, 2, KV, hd); ``kv_cache``: (2, slots, KV, max_len, hd).
    Returns (T, H, hd).
    """
    T, H, hd = q.shape
    kv_cache[:, lay.slots, :, lay.positions] = kv_new          # write this step's keys/values
    k_cache, v_cache = kv_cache[0], kv_cache[1]                # (slots, KV, max_len, hd) views
    attn = torch.empty(T, H, hd, dtype=q.dtype, device=q.device)
    # one query per slot: (span, H, 1, hd) against each slot's past (span, KV, ctx, hd)
    if lay.single:
        if lay.dense:
            qs = q[:lay.span].unsqueeze(2)
        else:
            qs = q.new_zeros(lay.span, H, 1, hd)
            qs[lay.single_slots] = q[lay.single_rows].unsqueeze(2)
        out = decode_attention(qs, k_cache[:lay.span, :, :lay.max_ctx],
                               v_cache[:lay.span, :, :lay.max_ctx],
                               lay.single_mask)                # (span, H, hd)
        place_decodes(attn, out if lay.dense else out[lay.single_slots], lay)
    for row, c in lay.multi:
        n, end = len(c.token_ids), c.start + len(c.token_ids)
        attn[row:row + n] = chunk_attention(q[row:row + n], k_cache[c.slot:c.slot + 1, :, :end],
                                            v_cache[c.slot:c.slot + 1, :, :end])
    return attn
