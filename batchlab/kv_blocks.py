"""Paged KV accounting: fixed-size blocks handed out as sequences grow, shared by prefix hash.

The slot cache (``kv_cache.py``) gives every admitted sequence room for its whole possible length
up front. A paged cache (vLLM's PagedAttention) cuts the memory into **blocks** of
``block_size`` tokens (16 by default, vLLM's default) and gives a sequence a new block only when
its tokens spill over the last one. A sequence's **block table** lists its blocks in order:
token ``i`` lives at offset ``i % block_size`` of block ``table[i // block_size]``. At most the
last block of each sequence is partly empty, so the memory that holds no token is under one
block per sequence.

``BlockManager`` below is only the accounting a scheduler sees (it implements the
``kv_space.KVSpace`` contract, the paged way); it touches no tensors. ``paged_kv_cache.PagedKVCache`` adds the
tensors for the real model; the simulator uses a ``BlockManager`` alone.

What a scheduler does with it (``schedulers/continuous.py``):

- **admit** a request with ``admit(id, n, max_tokens, prompt_ids)``: blocks for the ``n`` tokens
  its first step computes (prefix hits among them), not its whole length;
- **grow** it before each step with ``can_grow(id, n)`` / ``grow(id, n)``: room for ``n`` more
  tokens, a new block every ``block_size`` tokens;
- when a running sequence cannot grow, **preempt** another (``free`` its blocks and recompute it
  later);
- ``free(id)`` when it ends.

Prefix caching (``enable_prefix_caching=True``), as in vLLM and nano-vllm: every *full* block of
a prompt is identified by a hash chained over the whole prefix up to and including that block,
``hash((hash of the previous block, this block's token ids))``, so two blocks match only if
everything before them matches too (the keys and values at a position depend on every earlier
token). A new sequence whose prompt starts with cached blocks takes them (reference count + 1)
instead of computing them again. A block whose reference count drops to 0 keeps its hash and its
contents and waits in the free queue; it is reused as a hit if asked for again before it is
needed for something else, and the least recently freed block is the first to be overwritten
(LRU eviction). Only prompt tokens are hashed here (vLLM also caches generated tokens); at least
one token of a prompt is always computed, so its step produces logits.

Counting memory: ``used_blocks`` are blocks referenced by at least one sequence (a shared block
counts once); ``num_free_blocks`` includes cached blocks nobody references. ``reserve_blocks``
keeps that many free blocks out of reach of admission, for running sequences to grow into
(vLLM's v0 scheduler had such a "watermark"; v1's default is none, as here).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from batchlab.checks import check_bool, check_int, is_int
from batchlab.kv_space import KVCacheFullError

DEFAULT_BLOCK_SIZE = 16   # vLLM's default block size on GPUs


def check_block_size(block_size: object) -> None:
    check_int("block_size", block_size, hint=f"tokens per block; vLLM uses {DEFAULT_BLOCK_SIZE}")


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``."""
    return -(-num_tokens // block_size)


def chain_hash(parent: int | None, block_tokens: Sequence[int]) -> int:
    """The hash of one full block: its own token ids chained onto the hash of the block before."""
    return hash((parent, tuple(block_tokens)))


class BlockPool:
    """The blocks themselves: reference counts, the free queue (LRU), and the prefix cache's hashes.

    A block is free when nobody references it; a free block may still hold a cached prefix (its
    hash), which is evicted only when the block is taken for something else.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks  # checks a hash hit
        self.hash_to_block: dict[int, int] = {}
        # Blocks nobody references, least recently freed first (the next to be overwritten).
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.hash_to_block)

    def prefix_hits(self, prompt_ids: Sequence[int] | None, max_tokens: int) -> list[int]:
        """The cached blocks that start ``prompt_ids``: full blocks only, at most ``max_tokens``."""
        if not self.enable_prefix_caching or prompt_ids is None:
            return []
        bs = self.block_size
        hits: list[int] = []
        parent = None
        for b in range(min(len(prompt_ids), max_tokens) // bs):
            tokens = tuple(prompt_ids[b * bs:(b + 1) * bs])
            parent = chain_hash(parent, tokens)
            block = self.hash_to_block.get(parent)
            if block is None or self.block_tokens[block] != tokens:
                break
            hits.append(block)
        return hits

    def _take_free_block(self) -> int:
        """The least recently freed block; if it still holds a cached prefix, that entry is evicted."""
        block, _ = self.free_queue.popitem(last=False)
        h = self.block_hash[block]
        if h is not None:
            del self.hash_to_block[h]
            self.block_hash[block] = self.block_tokens[block] = None
            self.num_evictions += 1
        self.ref_count[block] = 1
        return block

    def _reference(self, block: int) -> None:
        """One more sequence holds ``block`` (a prefix hit); a free one leaves the free queue."""
        if self.ref_count[block] == 0:
            del self.free_queue[block]
        self.ref_count[block] += 1

    def _cache(self, block: int, h: int, tokens: tuple[int, ...]) -> None:
        """Register ``block`` as holding the full prompt block whose chained hash is ``h``."""
        if h not in self.hash_to_block and self.block_hash[block] is None:
            self.hash_to_block[h] = block
            self.block_hash[block], self.block_tokens[block] = h, tokens


class BlockManager(BlockPool):
    """Per-sequence block tables over a ``BlockPool``: admission, growth, release, prefix sharing.

    ``num_blocks``: blocks in the pool. ``max_seq_len``: the longest sequence allowed (``None``:
    the whole pool). ``enable_prefix_caching``: share full prompt blocks by hash.
    ``reserve_blocks``: free blocks admission must leave untouched (growth may use them).
    """

    def __init__(self, num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE,
                 max_seq_len: int | None = None, enable_prefix_caching: bool = False,
                 reserve_blocks: int = 0) -> None:
        check_block_size(block_size)
        check_int("num_blocks", num_blocks,
                  hint=f"the KV budget must hold at least one block of {block_size} tokens")
        check_int("max_seq_len", max_seq_len, allow_none=True)
        check_bool("enable_prefix_caching", enable_prefix_caching)
        if not is_int(reserve_blocks) or not 0 <= reserve_blocks < num_blocks:
            raise ValueError(f"reserve_blocks={reserve_blocks!r}; must be an int in 0..{num_blocks - 1} "
                             "(free blocks kept back from admission for running sequences to grow)")
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self.max_seq_len = max_seq_len
        self.reserve_blocks = reserve_blocks
        self.tables: dict[str, list[int]] = {}
        self.num_tokens_of: dict[str, int] = {}       # token positions each sequence has room for
        # Prefix caching: each sequence's prompt ids, and (blocks hashed so far, the last hash).
        self._prompt_of: dict[str, Sequence[int]] = {}
        self._hashed: dict[str, tuple[int, int | None]] = {}
        self.num_hit_tokens = 0                       # prompt tokens served from cache, over the run

    @classmethod
    def from_tokens(cls, capacity_tokens: int, block_size: int = DEFAULT_BLOCK_SIZE,
                    max_seq_len: int | None = None, enable_prefix_caching: bool = False,
                    reserve_blocks: int = 0) -> "BlockManager":
        """As many whole blocks as ``capacity_tokens`` token positions hold."""
        check_block_size(block_size)
        if not is_int(capacity_tokens) or capacity_tokens < block_size:
            raise ValueError(f"capacity_tokens={capacity_tokens!r} is below one block of "
                             f"block_size={block_size} tokens; give more tokens or smaller blocks")
        return cls(capacity_tokens // block_size, block_size, max_seq_len, enable_prefix_caching,
                   reserve_blocks)

    # --- sizes (the KVSpace interface) -------------------------------------------------------------
    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def used_tokens(self) -> int:
        """Token positions in blocks that some sequence holds (whole blocks; shared ones once)."""
        return self.used_blocks * self.block_size

    @property
    def held_tokens(self) -> int:
        """Token positions sequences hold room for, summed per sequence (shared blocks count for
        each sharer); against ``used_tokens`` it shows the part of last blocks left empty."""
        return sum(self.num_tokens_of.values())

    def fits_ever(self, num_tokens: int) -> bool:
        if self.max_seq_len is not None and num_tokens > self.max_seq_len:
            return False
        # Alone in the cache it must be admissible (reserve kept) and able to grow to its end.
        blocks = blocks_for(num_tokens, self.block_size)
        return 1 <= num_tokens and blocks + self.reserve_blocks <= self.num_blocks

    def block_table(self, request_id: str) -> list[int]:
        try:
            return self.tables[request_id]
        except KeyError:
            raise KeyError(f"request {request_id!r} holds no KV blocks; a scheduler must admit it "
                           "before it runs") from None

    def cached_prefix_tokens(self, prompt_ids: Sequence[int] | None, max_tokens: int) -> int:
        """Leading tokens of ``prompt_ids`` already in cached blocks (a multiple of ``block_size``,
        at most ``max_tokens``); 0 without prefix caching."""
        return len(self.prefix_hits(prompt_ids, max_tokens)) * self.block_size

    # --- admission ---------------------------------------------------------------------------------
    def _blocks_to_take(self, num_tokens: int, hits: list[int]) -> int:
        """Free blocks that admitting a sequence of ``num_tokens`` with ``hits`` would use up: new
        blocks, plus hit blocks that sit in the free queue (reviving one takes it off the queue)."""
        revived = sum(1 for b in hits if self.ref_count[b] == 0)
        return blocks_for(num_tokens, self.block_size) - len(hits) + revived

    def can_admit(self, num_tokens: int, max_tokens: int | None = None,
                  prompt_ids: Sequence[int] | None = None) -> bool:
        """Could a new sequence get room for its first ``num_tokens`` tokens now, leaving
        ``reserve_blocks`` free? (``max_tokens``: paged admission does not reserve it.)"""
        if not self.fits_ever(num_tokens):
            return False
        hits = self.prefix_hits(prompt_ids, num_tokens - 1)
        return self._blocks_to_take(num_tokens, hits) + self.reserve_blocks <= len(self.free_queue)

    def admit(self, request_id: str, num_tokens: int, max_tokens: int | None = None,
              prompt_ids: Sequence[int] | None = None) -> int:
        """Give ``request_id`` blocks for its first ``num_tokens`` tokens; return how many of them
        were already cached (prefix hits, which the sequence need not compute)."""
        if request_id in self.tables:
            raise ValueError(f"request {request_id!r} already holds {len(self.tables[request_id])} KV blocks")
        if not self.can_admit(num_tokens, max_tokens, prompt_ids):
            raise KVCacheFullError(
                f"request {request_id!r} needs blocks for {num_tokens} tokens; {len(self.free_queue)} of "
                f"{self.num_blocks} blocks of {self.block_size} are free ({self.reserve_blocks} reserved)")
        hits = self.prefix_hits(prompt_ids, num_tokens - 1)
        for b in hits:
            self._reference(b)
        self.tables[request_id] = list(hits)
        self.num_tokens_of[request_id] = len(hits) * self.block_size
        if self.enable_prefix_caching and prompt_ids is not None:
            self._prompt_of[request_id] = prompt_ids
            self._hashed[request_id] = (len(hits), self.block_hash[hits[-1]] if hits else None)
        if not self.grow(request_id, num_tokens - len(hits) * self.block_size):
            raise AssertionError("admission checked the room it needs")      # (can_admit said yes)
        self.num_hit_tokens += len(hits) * self.block_size
        return len(hits) * self.block_size

    # --- growth ------------------------------------------------------------------------------------
    def blocks_to_grow(self, request_id: str, num_tokens: int) -> int:
        """New blocks ``request_id`` needs to hold ``num_tokens`` more tokens."""
        held = self.num_tokens_of[request_id] + num_tokens
        return -(-held // self.block_size) - len(self.tables[request_id])   # blocks_for(held) - held blocks

    def can_grow(self, request_id: str, num_tokens: int) -> bool:
        """Could ``request_id`` hold ``num_tokens`` more tokens (using any free block)?"""
        if self.max_seq_len is not None and self.num_tokens_of[request_id] + num_tokens > self.max_seq_len:
            return False
        return self.blocks_to_grow(request_id, num_tokens) <= len(self.free_queue)

    def grow(self, request_id: str, num_tokens: int) -> bool:
        """Make room for ``num_tokens`` more tokens of ``request_id``, a new block when one fills;
        False (and nothing changes) when there is no room. (Schedulers grow every running
        sequence every step, so this is written out lean.)"""
        if num_tokens < 0:
            raise ValueError(f"request {request_id!r}: grow by num_tokens={num_tokens}; must be >= 0")
        held = self.num_tokens_of[request_id] + num_tokens
        table = self.tables[request_id]
        new_blocks = -(-held // self.block_size) - len(table)            # blocks_for(held) - held blocks
        if new_blocks > len(self.free_queue) or (self.max_seq_len is not None and held > self.max_seq_len):
            return False
        for _ in range(new_blocks):
            table.append(self._take_free_block())
        self.num_tokens_of[request_id] = held
        if request_id in self._prompt_of:
            self._hash_full_prompt_blocks(request_id)
        return True

    def _hash_full_prompt_blocks(self, request_id: str) -> None:
        """Register the sequence's prompt blocks that are now full (their tokens are computed in the
        step being planned) so later sequences can hit them."""
        prompt, table = self._prompt_of[request_id], self.tables[request_id]
        bs = self.block_size
        done = min(self.num_tokens_of[request_id], len(prompt)) // bs
        b, parent = self._hashed[request_id]
        while b < done:
            tokens = tuple(prompt[b * bs:(b + 1) * bs])
            parent = chain_hash(parent, tokens)
            self._cache(table[b], parent, tokens)
            b += 1
        self._hashed[request_id] = (b, parent)
        if b == len(prompt) // bs:           # every full prompt block is hashed: nothing left to do
            del self._prompt_of[request_id]

    # --- release -----------------------------------------------------------------------------------
    def free(self, request_id: str) -> None:
        """Drop the sequence's references. A block nobody holds joins the free queue; its tail blocks
        first, so a shared prompt's head blocks are the last of them to be evicted."""
        try:
            table = self.tables.pop(request_id)
        except KeyError:
            raise KeyError(f"request {request_id!r} holds no KV blocks (freed twice?)") from None
        del self.num_tokens_of[request_id]
        self._prompt_of.pop(request_id, None)
        self._hashed.pop(request_id, None)
        ref_count, free_queue, block_hash = self.ref_count, self.free_queue, self.block_hash
        for block in reversed(table):
            ref_count[block] -= 1
            if ref_count[block] == 0:      # nobody holds it: it joins the free queue, at the front
                free_queue[block] = None   # if it caches nothing (reuse it first), else at the back
                if block_hash[block] is None:
                    free_queue.move_to_end(block, last=False)

    def check(self) -> None:
        """Raise if the books do not balance (``check_books``)."""
        check_books(self)

    def __repr__(self) -> str:
        return (f"BlockManager({self.used_blocks}/{self.num_blocks} blocks of {self.block_size} used, "
                f"seqs={len(self.tables)}, cached={self.num_cached_blocks}, "
                f"prefix_caching={self.enable_prefix_caching})")


def check_books(kv: BlockManager) -> None:
    """Raise if the books do not balance: every reference is a table entry, every block is free
    or referenced (never both), and no table lists a block twice."""
    counts = [0] * kv.num_blocks
    for rid, table in kv.tables.items():
        if len(set(table)) != len(table):
            raise AssertionError(f"request {rid!r} lists a block twice: {table}")
        if len(table) != blocks_for(kv.num_tokens_of[rid], kv.block_size):
            raise AssertionError(f"request {rid!r} holds {len(table)} blocks for "
                                 f"{kv.num_tokens_of[rid]} tokens")
        for b in table:
            counts[b] += 1
    if counts != kv.ref_count:
        raise AssertionError("reference counts do not match the block tables")
    free = [b for b in range(kv.num_blocks) if counts[b] == 0]
    if sorted(kv.free_queue) != free:
        raise AssertionError("the free queue does not hold exactly the unreferenced blocks")
    for h, b in kv.hash_to_block.items():
        if kv.block_hash[b] != h:
            raise AssertionError(f"block {b} is cached under a hash it does not carry")
