"""The paged KV cache's tensors: one pool of blocks, read and written through block tables.

Layout: every token position of every block is one row of a pool, per layer::

    kv: (num_layers, num_blocks * block_size, 2, num_kv_heads, head_dim)   # [..., 0, :, :] keys, 1 values

Token ``i`` of a sequence with block table ``table`` lives in row
``table[i // block_size] * block_size + i % block_size`` (vLLM calls this row the token's *slot
mapping*). A step therefore

1. **scatters** its new keys and values into their rows (one indexed copy per layer), then
2. **gathers** each sequence's past through its table into a dense (context, KV, hd) block and
   attends over it, as the slot cache's step does over its contiguous slot.

The gather is the price of paging on a CPU without a paged-attention kernel: it copies the
context's keys and values once per layer (GPU kernels such as vLLM's read the blocks in place).
``scripts/bench_paged.py`` measures what it costs against the slot cache's step.

The accounting (which blocks a sequence holds, prefix hashes, reference counts) is
``kv_blocks.BlockManager``, which ``PagedKVCache`` extends with the tensors; schedulers see
only the accounting (``plan.KVSpace``). ``llama.forward_step`` takes either cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from batchlab.kv_blocks import DEFAULT_BLOCK_SIZE, BlockManager
from batchlab.model.kv_cache import DTYPE_BYTES, KVCache


class PagedKVCache(BlockManager):
    """A pool of ``num_blocks`` blocks of ``block_size`` tokens for every layer, with the
    ``BlockManager``'s accounting (growth on demand, prefix caching, reference counts)."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int = DEFAULT_BLOCK_SIZE, max_seq_len: int | None = None,
                 dtype: torch.dtype = torch.float32, device: str = "cpu",
                 enable_prefix_caching: bool = False, reserve_blocks: int = 0) -> None:
        super().__init__(num_blocks, block_size, max_seq_len, enable_prefix_caching, reserve_blocks)
        for name, value in [("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim)]:
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}; must be an int >= 1")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype={dtype!r}; allowed: {list(DTYPE_BYTES)}")
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.kv = torch.zeros((num_layers, num_blocks * block_size, 2, num_kv_heads, head_dim),
                              dtype=dtype, device=device)

    @classmethod
    def from_budget(cls, memory_bytes: int, num_layers: int, num_kv_heads: int, head_dim: int,
                    block_size: int = DEFAULT_BLOCK_SIZE, max_seq_len: int | None = None,
                    dtype: torch.dtype = torch.float32, device: str = "cpu",
                    enable_prefix_caching: bool = False, reserve_blocks: int = 0) -> "PagedKVCache":
        """As many blocks as ``memory_bytes`` holds."""
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"block_size={block_size!r}; must be an int >= 1 (tokens per block)")
        block_bytes = KVCache.token_bytes(num_layers, num_kv_heads, head_dim, dtype) * block_size
        num_blocks = int(memory_bytes // block_bytes)
        if num_blocks < 1:
            raise ValueError(f"memory_bytes={memory_bytes:,} is below one block of {block_size} tokens "
                             f"({block_bytes:,} bytes); give more memory or smaller blocks")
        return cls(num_layers, num_kv_heads, head_dim, num_blocks, block_size, max_seq_len, dtype,
                   device, enable_prefix_caching, reserve_blocks)

    @property
    def bytes_per_token(self) -> int:
        return KVCache.token_bytes(self.num_layers, self.num_kv_heads, self.head_dim, self.kv.dtype)

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_token * self.capacity_tokens

    def __repr__(self) -> str:
        return (f"PagedKVCache({self.num_blocks} blocks x {self.block_size} tokens, "
                f"{self.bytes_per_token:,} B/token, {self.total_bytes / 2**20:,.0f} MiB, "
                f"{self.used_blocks} used, {len(self.tables)} seqs, "
                f"prefix_caching={self.enable_prefix_caching})")


@dataclass(frozen=True)
class PagedSeqChunk:
    """One sequence's part of a step on a paged cache: ``token_ids`` go to positions ``start,
    start+1, ...`` of the sequence whose blocks are ``block_table`` (which must already cover
    them); ``want_logits`` asks for the next-token logits after its last token."""

    block_table: list[int]
    start: int
    token_ids: list[int]
    want_logits: bool


class PagedStepLayout:
    """Index tensors for one paged step, computed once and shared by all layers."""

    def __init__(self, chunks: list[PagedSeqChunk], cache: PagedKVCache, config, device) -> None:
        if not chunks:
            raise ValueError("a step needs at least one sequence chunk; got none")
        bs = cache.block_size
        ids, positions, rows_of_tokens, logit_rows = [], [], [], []
        single: list[tuple[int, PagedSeqChunk]] = []   # (row, chunk): chunks of exactly 1 token
        self.multi: list[tuple[int, int, torch.Tensor]] = []   # (first row, tokens, past rows)
        row = 0
        for c in chunks:
            n, end = len(c.token_ids), c.start + len(c.token_ids)
            if n == 0:
                raise ValueError("a chunk has no tokens; each chunk needs at least 1")
            if c.start < 0 or end > len(c.block_table) * bs or end > config.max_position:
                raise ValueError(f"positions {c.start}..{end - 1} go past the chunk's {len(c.block_table)} "
                                 f"blocks of {bs} tokens (or the model context {config.max_position})")
            bad = [t for t in c.token_ids if not 0 <= t < config.vocab_size]
            if bad:
                raise ValueError(f"token id {bad[0]} is outside the vocabulary 0..{config.vocab_size - 1}")
            ids += c.token_ids
            table = torch.tensor(c.block_table, dtype=torch.long)
            pos = torch.arange(end)
            past_rows = table[pos // bs] * bs + pos % bs                  # (end,) pool rows of 0..end-1
            rows_of_tokens.append(past_rows[c.start:])
            positions += range(c.start, end)
            if n == 1:
                single.append((row, c))
            else:
                self.multi.append((row, n, past_rows.to(device)))
            if c.want_logits:
                logit_rows.append(row + n - 1)
            row += n
        self.num_tokens = row
        self.ids = torch.tensor(ids, dtype=torch.long, device=device)              # (T,)
        self.positions = torch.tensor(positions, dtype=torch.long, device=device)  # (T,)
        self.slot_mapping = torch.cat(rows_of_tokens).to(device)                   # (T,) pool rows
        self.logit_rows = torch.tensor(logit_rows, dtype=torch.long, device=device)
        self.single = bool(single)
        if single:
            # Single-token chunks attend together: each one's past gathered into a (S, ctx) grid of
            # pool rows, padded with row 0 and masked past its own length.
            S, ctx = len(single), max(c.start for _, c in single) + 1
            max_blocks = -(-ctx // bs)
            tables = torch.zeros(S, max_blocks, dtype=torch.long)
            for i, (_, c) in enumerate(single):
                used = c.block_table[:max_blocks]
                tables[i, :len(used)] = torch.tensor(used, dtype=torch.long)
            pos = torch.arange(ctx)
            self.single_shape = (S, ctx)
            self.single_index = (tables[:, pos // bs] * bs + pos % bs).reshape(-1).to(device)  # (S·ctx,)
            lengths = torch.tensor([c.start + 1 for _, c in single])
            self.single_mask = (pos[None, :] < lengths[:, None])[:, None, None, :].to(device)  # (S,1,1,ctx)
            rows = [r for r, _ in single]
            self.single_rows = torch.tensor(rows, dtype=torch.long, device=device)
            self.single_dense = rows == list(range(S))    # decodes first, as schedulers plan them


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
    if lay.single:
        S, ctx = lay.single_shape
        past = kv_layer.index_select(0, lay.single_index).view(S, ctx, *kv_layer.shape[1:])  # gathered
        k = past[:, :, 0].transpose(1, 2)                    # (S, KV, ctx, hd)
        v = past[:, :, 1].transpose(1, 2)
        qs = (q[:S] if lay.single_dense else q[lay.single_rows]).unsqueeze(2)   # (S, H, 1, hd)
        out = F.scaled_dot_product_attention(qs, k, v, attn_mask=lay.single_mask, enable_gqa=True)
        if lay.single_dense:
            attn[:S] = out[:, :, 0]
        else:
            attn[lay.single_rows] = out[:, :, 0]
    for row, n, past_rows in lay.multi:
        end = past_rows.shape[0]
        past = kv_layer.index_select(0, past_rows)           # (end, 2, KV, hd): cached + new
        k = past[:, 0].transpose(0, 1).unsqueeze(0)          # (1, KV, end, hd)
        v = past[:, 1].transpose(0, 1).unsqueeze(0)
        qc = q[row:row + n].transpose(0, 1).unsqueeze(0)     # (1, H, n, hd)
        start = end - n
        if start == 0:
            out = F.scaled_dot_product_attention(qc, k, v, is_causal=True, enable_gqa=True)
        else:  # a later chunk (or one after a prefix hit): query i sees keys 0 .. start + i
            mask = (torch.arange(end, device=q.device)[None, :]
                    <= torch.arange(start, end, device=q.device)[:, None])
            out = F.scaled_dot_product_attention(qc, k, v, attn_mask=mask, enable_gqa=True)
        attn[row:row + n] = out[0].transpose(0, 1)
    return attn
