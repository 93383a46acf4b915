"""The paged KV cache's tensors: one pool of blocks, read and written through block tables.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchlab.kv_blocks import DEFAULT_BLOCK_SIZE, BlockManager, check_block_size
from batchlab.model.kv_cache import KVCache, check_cache_shape
from batchlab.model.step_layout import StepLayout, chunk_attention, context_groups, decode_attention


class PagedKVCache(BlockManager):
    """A pool of ``num_blocks`` blocks of ``block_size`` tokens for every layer, with the
    ``BlockManager``'s accounting (growth on demand, prefix caching, reference counts)."""

    stores_values = True

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int = DEFAULT_BLOCK_SIZE, max_seq_len: int | None = None,
                 dtype: torch.dtype = torch.float32, device: str = "cpu",
                 enable_prefix_caching: bool = False, reserve_blocks: int = 0) -> None:
        super().__init__(num_blocks, block_size, max_seq_len, enable_prefix_caching, reserve_blocks)
        check_cache_shape(num_layers, num_kv_heads, head_dim, dtype)
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.kv = torch.zeros((num_layers, num_blocks * block_size, 2, num_kv_heads, head_dim),
                              dtype=dtype, device=device)

    @classmethod
    def from_budget(cls, memory_bytes: int, num_layers: int, num_kv_heads: int, head_dim: int,
                    block_size: int = DEFAULT_BLOCK_SIZE, max_seq_len: int | None = None,
                    dtype: torch.dtype = torch.float32, device: str = "cpu",
                    enable_prefix_caching: bool = False, reserve_blocks: int = 0) -> "PagedKVCache":
        """As many blocks as ``memory_bytes`` holds."""
        check_block_size(block_size)
        block_bytes = KVCache.token_bytes(num_layers, num_kv_heads, head_dim, dtype) * block_size
        num_blocks = int(memory_bytes // block_bytes)
        if num_blocks < 1:
            raise ValueError(f"memory_bytes={memory_bytes:,} is below one block of {block_size} "
                             f"tokens ({block_bytes:,} bytes); give more memory or smaller blocks")
        return cls(num_layers, num_kv_heads, head_dim, num_blocks, block_size, max_seq_len, dtype,
                   device, enable_prefix_caching, reserve_blocks)

    @property
    def bytes_per_token(self) -> int:
        return KVCache.token_bytes(self.num_layers, self.num_kv_heads, self.head_dim, self.kv.dtype)

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_token * self.capacity_tokens

    # --- what a step needs ----------------------------------------------------------------------
    def seq_chunk(self, request_id: str, start: int, token_ids: list[int], want_logits: bool,
                  num_logits: int = 1) -> "PagedSeqChunk":
        """The step's view of one request's chunk: its block table."""
        return PagedSeqChunk(self.block_table(request_id), start, token_ids, want_logits,
                             num_logits)

    def step_layout(self, chunks: list["PagedSeqChunk"], config, device) -> "PagedStepLayout":
        return PagedStepLayout(chunks, self, config, device)

    def attention(self, q: torch.Tensor, kv_new: torch.Tensor, layer: int,
                  lay: "PagedStepLayout") -> torch.Tensor:
        return paged_attention(q, kv_new, self.kv[layer], lay)

    # --- a disaggregated hand-off: a sequence's keys and values, out and in ----------------------
    def token_rows(self, request_id: str, num_tokens: int) -> torch.Tensor:
        """The pool rows of the sequence's first ``num_tokens`` positions (its slot mapping)."""
        pos = torch.arange(num_tokens)
        table = torch.tensor(self.block_table(request_id), dtype=torch.long)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def read_tokens(self, request_id: str, num_tokens: int) -> torch.Tensor:
        """A copy of the sequence's first ``num_tokens`` positions:
        (layers, num_tokens, 2, KV, hd)."""
        return self.kv[:, self.token_rows(request_id, num_tokens)]

    def write_tokens(self, request_id: str, kv: torch.Tensor) -> None:
        """Write ``kv`` (layers, n, 2, KV, hd), computed elsewhere, into the sequence's first n
        positions. (Blocks it shares as a prefix hit hold the same tokens' keys and values.)"""
        self.kv[:, self.token_rows(request_id, kv.shape[1])] = kv

    def __repr__(self) -> str:
        return (f"PagedKVCache({self.num_blocks} blocks x {self.block_size} tokens, "
                f"{self.bytes_per_token:,} B/token, {self.total_bytes / 2**20:,.0f} MiB, "
                f"{self.used_blocks} used, {len(self.tables)} seqs, "
                f"prefix_caching={self.enable_prefix_caching})")


@dataclass(frozen=True)
class PagedSeqChunk:
    """One sequence's part of a step on a paged cache: ``token_ids`` go to positions ``start,
    start+1, ...`` of the sequence whose blocks are ``block_table`` (which must already cover
    them); ``want_logits`` asks for the next-token logits after its last token (and after each
    of its last ``num_logits`` tokens: a speculative draft's check)."""

    block_table: list[int]
    start: int
    token_ids: list[int]
    want_logits: bool
    num_logits: int = 1       # with want_logits: logits after each of the last num_logits tokens


class PagedStepLayout(StepLayout):
    """A step's index tensors on a paged cache: each token's pool row (its slot mapping), each
    prompt chunk's past rows, and for the single-token chunks their pasts' rows on an (S, ctx)
    grid, padded with row 0 and masked past each one's own length."""

    def __init__(self, chunks: list[PagedSeqChunk], cache: PagedKVCache, config, device) -> None:
        self.block_size = cache.block_size
        super().__init__(chunks, config, device)
        past_rows = [self._rows(c.block_table, c.start + len(c.token_ids)) for c in chunks]
        self.slot_mapping = torch.cat([rows[c.start:]
                                       for c, rows in zip(chunks, past_rows)]).to(device)  # (T,)
        self.multi_past_rows = [rows.to(device) for c, rows in zip(chunks, past_rows)
                                if len(c.token_ids) > 1]
        # The single-token chunks attend in groups of similar context (``context_groups``), each
        # gathered and padded to its longest past: (rows in q, pool rows (n·ctx,), (n, ctx), mask).
        self.single_groups = []
        for members in context_groups([c.start + 1 for _, c in self.single]):
            chunks_g = [self.single[i][1] for i in members]
            rows = (slice(0, len(members))
                    if members == list(range(len(members))) and self.singles_first
                    else torch.tensor([self.single[i][0] for i in members], dtype=torch.long,
                                      device=device))
            self.single_groups.append((rows, *self._past_grid(chunks_g, device)))

    def _past_grid(self, chunks: list[PagedSeqChunk], device) -> tuple:
        """Pool rows of each chunk's past on an (n, ctx) grid, padded with row 0, and the mask
        keeping each to its own length: (rows (n·ctx,), (n, ctx), mask (n, 1, 1, ctx))."""
        n, ctx = len(chunks), max(c.start for c in chunks) + 1
        max_blocks = -(-ctx // self.block_size)
        tables = torch.zeros(n, max_blocks, dtype=torch.long)
        for i, c in enumerate(chunks):
            used = c.block_table[:max_blocks]
            tables[i, :len(used)] = torch.tensor(used, dtype=torch.long)
        lengths = torch.tensor([c.start + 1 for c in chunks])
        mask = (torch.arange(ctx)[None, :] < lengths[:, None])[:, None, None, :]
        return self._rows_of(tables, ctx).reshape(-1).to(device), (n, ctx), mask.to(device)

    def _rows_of(self, tables: torch.Tensor, end: int) -> torch.Tensor:
        """Pool rows of positions ``0..end-1`` through block tables (last dimension: blocks)."""
        pos = torch.arange(end)
        return tables[..., pos // self.block_size] * self.block_size + pos % self.block_size

    def _rows(self, block_table: list[int], end: int) -> torch.Tensor:
        return self._rows_of(torch.tensor(block_table, dtype=torch.long), end)     # (end,)

    def describe(self, chunk: PagedSeqChunk) -> str:
        return f"the chunk at {chunk.start} with {len(chunk.block_table)} blocks"

    def position_limit(self, chunk: PagedSeqChunk) -> tuple[int, str]:
        return (len(chunk.block_table) * self.block_size,
                f"{len(chunk.block_table)} blocks of {self.block_size}")


def paged_attention(q: torch.Tensor, kv_new: torch.Tensor, kv_layer: torch.Tensor,
                    lay: PagedStepLayout) -> torch.Tensor:
    """One layer's attention on a paged cache: write the step's keys/values into their pool rows,
    then attend each token to its sequence's past, gathered through its block table.

    ``q``: (T, H, hd); ``kv_new``: (T, 2, KV, hd); ``kv_layer``: (pool rows, 2, KV, hd).
    Returns (T, H, hd).
    """
    T, H, hd = q.shape
    # index_copy_ / index_select: the plain row copies (on CPU about twice as fast as the same
    # advanced indexing, kv_layer[rows], measured on one thread).
    kv_layer.index_copy_(0, lay.slot_mapping, kv_new)        # scatter this step's keys/values
    attn = torch.empty(T, H, hd, dtype=q.dtype, device=q.device)
    # single-token chunks, by context length
    for rows, index, (n, ctx), mask in lay.single_groups:
        # gathered (n, ctx, 2, KV, hd)
        past = kv_layer.index_select(0, index).view(n, ctx, *kv_layer.shape[1:])
        attn[rows] = decode_attention(q[rows].unsqueeze(2), past[:, :, 0].transpose(1, 2),
                                      past[:, :, 1].transpose(1, 2), mask)          # (n, H, hd)
    for (row, c), past_rows in zip(lay.multi, lay.multi_past_rows):
        n = len(c.token_ids)
        past = kv_layer.index_select(0, past_rows)           # (end, 2, KV, hd): cached + new
        attn[row:row + n] = chunk_attention(q[row:row + n], past[:, 0].transpose(0, 1).unsqueeze(0),
                                            past[:, 1].transpose(0, 1).unsqueeze(0))
    return attn
