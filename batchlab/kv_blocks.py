"""Paged KV accounting (``BlockManager``): blocks of ``block_size`` tokens handed out as
sequences grow, block tables, and prefix caching by chained block hashes with LRU eviction.

Accounting only: ``paged_kv_cache.PagedKVCache`` adds the tensors for the real model. At most the
last block of each sequence is partly empty. The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from batchlab.checks import check_bool, check_int, is_int
from batchlab.kv_space import KVCacheFullError

DEFAULT_BLOCK_SIZE = 16   # vLLM's default block size on GPUs
_CHAIN_MEMO_SIZE = 4096   # prompts whose block hashes are remembered (see BlockPool.block_chain)


def check_block_size(block_size: object) -> None:
    check_int("block_size", block_size, hint=f"tokens per block; vLLM uses {DEFAULT_BLOCK_SIZE}")


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``."""
    return -(-num_tokens // block_size)


def chain_hash(parent: int | None, block_tokens: Sequence[int]) -> int:
    """The hash of one full block: its own token ids chained onto the hash of the block before."""
    return hash((parent, tuple(block_tokens)))


def steps_before_blocks_run_out(held_tokens: Sequence[int], block_size: int,
                                free_blocks: int) -> int:
    """Decode steps (one token per sequence each) the sequences can take before a new block is
    needed and none is free. A sequence holding ``h`` tokens takes a block in every step that
    writes a position ``h + i - 1`` at the start of a block: first at step
    ``(-h) % block_size + 1``, then every ``block_size`` steps; each cycle of ``block_size`` steps
    takes one block each."""
    counts = [0] * block_size        # counts[r]: sequences whose next block comes at step r + 1
    for h in held_tokens:
        counts[(-h) % block_size] += 1
    cycles, left = divmod(free_blocks, len(held_tokens))
    for r, count in enumerate(counts):
        if count > left:
            return cycles * block_size + r
        left -= count
    return cycles * block_size + block_size     # not reached: the counts add up to more than left


class BlockPool:
    """The blocks themselves: reference counts, the free blocks (cached ones in LRU order), and the
    prefix cache's hashes.

    A block is free when nobody references it; a free block may still hold a cached prefix (its
    hash), which is evicted only when the block is taken for something else.
    """

    stores_values: bool = False        # counts blocks; the model's paged cache says True

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks  # checks a hash hit
        self.hash_to_block: dict[int, int] = {}
        # Blocks nobody references, in the order they will be taken: first the ones that cache
        # nothing (a stack: the last one pushed is taken first), then the cached ones, least
        # recently freed first (the LRU end; taking one evicts its prefix).
        self.free_uncached: list[int] = list(range(num_blocks - 1, -1, -1))
        self.free_cached: OrderedDict[int, None] = OrderedDict()
        self.num_evictions = 0
        # Each prompt's chained block hashes, computed once: a scheduler asks about the head of its
        # queue every step. Keyed by the prompt list's identity (the entry holds it, so the id
        # cannot be reused while the entry lives); cleared when it grows past _CHAIN_MEMO_SIZE.
        self._chains: dict[int, tuple[Sequence[int], list[int], list[tuple[int, ...]], list]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_uncached) + len(self.free_cached)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self.hash_to_block)

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def used_tokens(self) -> int:
        """Token positions in blocks that some sequence holds (whole blocks; shared ones once)."""
        return self.used_blocks * self.block_size

    def cached_prefix_tokens(self, prompt_ids: Sequence[int] | None, max_tokens: int) -> int:
        """Leading tokens of ``prompt_ids`` already in cached blocks (a multiple of ``block_size``,
        at most ``max_tokens``); 0 without prefix caching."""
        return len(self.prefix_hits(prompt_ids, max_tokens)) * self.block_size

    def prefix_hits(self, prompt_ids: Sequence[int] | None, max_tokens: int) -> list[int]:
        """The cached blocks that start ``prompt_ids``: full blocks only, at most ``max_tokens``."""
        if not self.enable_prefix_caching or prompt_ids is None:
            return []
        num_blocks = min(len(prompt_ids), max_tokens) // self.block_size
        if num_blocks <= 0:
            return []
        memo = self._chain(prompt_ids)[3]
        # The hits found last time still hold unless a cached block was evicted since (blocks are
        # only added otherwise): the walk goes on from where it stopped.
        hits = memo[1] if memo[0] == self.num_evictions else []
        if len(hits) < num_blocks:
            hash_to_block, block_tokens = self.hash_to_block, self.block_tokens
            hashes, tokens = self.block_chain(prompt_ids, len(hits) + 1)
            # (the common miss, without hashing on)
            if hash_to_block.get(hashes[len(hits)]) is not None:
                hashes, tokens = self.block_chain(prompt_ids, num_blocks)
                hits = hits[:]
                for b in range(len(hits), num_blocks):
                    block = hash_to_block.get(hashes[b])
                    if block is None or block_tokens[block] != tokens[b]:
                        break
                    hits.append(block)
            memo[:] = [self.num_evictions, hits]
        return hits[:num_blocks]

    def block_chain(self, prompt_ids: Sequence[int],
                    num_blocks: int) -> tuple[list[int], list[tuple[int, ...]]]:
        """The chained hashes and the token ids of (at least) the first ``num_blocks`` full blocks
        of ``prompt_ids``, computed once per prompt."""
        _, hashes, tokens, _ = self._chain(prompt_ids)
        bs = self.block_size
        for b in range(len(hashes), min(num_blocks, len(prompt_ids) // bs)):
            block_tokens = tuple(prompt_ids[b * bs:(b + 1) * bs])
            hashes.append(chain_hash(hashes[-1] if hashes else None, block_tokens))
            tokens.append(block_tokens)
        return hashes, tokens

    def _chain(self, prompt_ids: Sequence[int]) -> tuple[Sequence[int], list[int],
                                                         list[tuple[int, ...]], list]:
        """The prompt's memo entry: (the prompt, its block hashes and token ids so far, and
        [evictions when last looked up, the hits found then])."""
        entry = self._chains.get(id(prompt_ids))
        if entry is None or entry[0] is not prompt_ids:
            if len(self._chains) >= _CHAIN_MEMO_SIZE:
                self._chains.clear()
            entry = self._chains[id(prompt_ids)] = (prompt_ids, [], [], [-1, []])
        return entry

    def _take_free_block(self) -> int:
        """A free block that caches nothing if there is one, else the least recently freed cached
        block, whose prefix is evicted."""
        if self.free_uncached:
            block = self.free_uncached.pop()
        else:
            block, _ = self.free_cached.popitem(last=False)
            del self.hash_to_block[self.block_hash[block]]
            self.block_hash[block] = self.block_tokens[block] = None
            self.num_evictions += 1
        self.ref_count[block] = 1
        return block

    def _take_blocks(self, table: list[int], num_blocks: int) -> bool:
        """Append ``num_blocks`` free blocks to ``table``, in the order they are taken; False (and
        nothing taken) if there are not that many."""
        uncached = self.free_uncached
        if num_blocks <= len(uncached):          # the common case: no cached prefix is evicted
            ref_count = self.ref_count
            for _ in range(num_blocks):
                block = uncached.pop()
                ref_count[block] = 1
                table.append(block)
        elif num_blocks <= len(uncached) + len(self.free_cached):
            for _ in range(num_blocks):
                table.append(self._take_free_block())
        else:
            return False
        return True

    def _reference(self, block: int) -> None:
        """One more sequence holds ``block`` (a prefix hit); a free one leaves the free blocks
        (a hit is always a cached block)."""
        if self.ref_count[block] == 0:
            del self.free_cached[block]
        self.ref_count[block] += 1

    def _unreference(self, blocks) -> None:
        """Drop one reference to each of ``blocks``, in order. A block nobody holds is free: one
        that caches nothing is reused first; a cached one waits at the LRU's newest end, to be
        hit again or evicted last."""
        ref_count, block_hash = self.ref_count, self.block_hash
        for block in blocks:
            ref_count[block] -= 1
            if ref_count[block] == 0:
                if block_hash[block] is None:
                    self.free_uncached.append(block)
                else:
                    self.free_cached[block] = None

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
            raise ValueError(f"reserve_blocks={reserve_blocks!r}; must be an int in 0.."
                             f"{num_blocks - 1} (free blocks kept back from admission for running "
                             "sequences to grow)")
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self.max_seq_len = max_seq_len
        self.reserve_blocks = reserve_blocks
        self.tables: dict[str, list[int]] = {}
        self.num_tokens_of: dict[str, int] = {}       # token positions each sequence has room for
        self._room: dict[str, int] = {}     # growth with no block to take or hash (``grow``)
        # Prefix caching: each sequence's prompt ids, and how many of its full blocks are hashed.
        self._prompt_of: dict[str, Sequence[int]] = {}
        self._hashed: dict[str, int] = {}
        self.num_hit_tokens = 0             # prompt tokens served from cache, over the run

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

    # --- sizes (the KVSpace interface, with BlockPool's capacity_tokens and used_tokens) ----------
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

    # --- admission --------------------------------------------------------------------------------
    def _blocks_to_take(self, num_tokens: int, hits: list[int]) -> int:
        """Free blocks that admitting a sequence of ``num_tokens`` with ``hits`` would use up: new
        blocks, plus hit blocks that are free (reviving one takes it off the free blocks)."""
        revived = sum(1 for b in hits if self.ref_count[b] == 0)
        return blocks_for(num_tokens, self.block_size) - len(hits) + revived

    def can_admit(self, num_tokens: int, max_tokens: int | None = None,
                  prompt_ids: Sequence[int] | None = None) -> bool:
        """Could a new sequence get room for its first ``num_tokens`` tokens now, leaving
        ``reserve_blocks`` free? (``max_tokens``: paged admission does not reserve it.)"""
        return self._admissible(num_tokens, self.prefix_hits(prompt_ids, num_tokens - 1))

    def _admissible(self, num_tokens: int, hits: list[int]) -> bool:
        return (self.fits_ever(num_tokens)
                and (self._blocks_to_take(num_tokens, hits) + self.reserve_blocks
                     <= self.num_free_blocks))

    def admit(self, request_id: str, num_tokens: int, max_tokens: int | None = None,
              prompt_ids: Sequence[int] | None = None) -> int:
        """Give ``request_id`` blocks for its first ``num_tokens`` tokens; return how many of them
        were already cached (prefix hits, which the sequence need not compute)."""
        if request_id in self.tables:
            raise ValueError(f"request {request_id!r} already holds "
                             f"{len(self.tables[request_id])} KV blocks")
        hits = self.prefix_hits(prompt_ids, num_tokens - 1)
        if not self._admissible(num_tokens, hits):
            raise KVCacheFullError(
                f"request {request_id!r} needs blocks for {num_tokens} tokens; "
                f"{self.num_free_blocks} of {self.num_blocks} blocks of {self.block_size} are free "
                f"({self.reserve_blocks} reserved)")
        for b in hits:
            self._reference(b)
        self.tables[request_id] = list(hits)
        self.num_tokens_of[request_id] = self._room[request_id] = len(hits) * self.block_size
        if self.enable_prefix_caching and prompt_ids is not None:
            self._prompt_of[request_id] = prompt_ids
            self._hashed[request_id] = len(hits)
        if not self.grow(request_id, num_tokens - len(hits) * self.block_size):
            raise AssertionError("admission checked the room it needs")      # (can_admit said yes)
        self.num_hit_tokens += len(hits) * self.block_size
        return len(hits) * self.block_size

    # --- growth -----------------------------------------------------------------------------------
    def can_grow(self, request_id: str, num_tokens: int) -> bool:
        """Could ``request_id`` hold ``num_tokens`` more tokens (using any free block)?"""
        held = self.num_tokens_of[request_id] + num_tokens
        if self.max_seq_len is not None and held > self.max_seq_len:
            return False
        return (blocks_for(held, self.block_size) - len(self.tables[request_id])
                <= self.num_free_blocks)

    def grow_each(self, request_ids: Sequence[str]) -> int:
        """``grow(id, 1)`` for each sequence in turn until one finds no room; how many grew."""
        tokens, room = self.num_tokens_of, self._room
        for i, rid in enumerate(request_ids):
            held = tokens[rid] + 1
            if held <= room[rid]:
                tokens[rid] = held
            elif not self.grow(rid, 1):
                return i
        return len(request_ids)

    def grow(self, request_id: str, num_tokens: int) -> bool:
        """Make room for ``num_tokens`` more tokens of ``request_id``, a new block when one fills;
        False (and nothing changes) when there is no room. (Schedulers grow every running
        sequence every step, so the common case, room left in the last block, is checked first.)"""
        held = self.num_tokens_of[request_id] + num_tokens
        if held <= self._room[request_id] and num_tokens >= 0:
            self.num_tokens_of[request_id] = held
            return True
        if num_tokens < 0:
            raise ValueError(f"request {request_id!r}: grow by num_tokens={num_tokens}; "
                             "must be >= 0")
        if self.max_seq_len is not None and held > self.max_seq_len:
            return False
        table = self.tables[request_id]
        # blocks_for(held) - held blocks
        new_blocks = -(-held // self.block_size) - len(table)
        if new_blocks > 0 and not self._take_blocks(table, new_blocks):
            return False
        self.num_tokens_of[request_id] = held
        # The room the quick check may give: to the end of the last block (or max_seq_len); none
        # while prompt blocks still wait to be hashed as they fill.
        room = len(table) * self.block_size
        if request_id in self._prompt_of:
            self._hash_full_prompt_blocks(request_id)
            if request_id in self._prompt_of:
                room = held
        self._room[request_id] = room if self.max_seq_len is None else min(room, self.max_seq_len)
        return True

    def _hash_full_prompt_blocks(self, request_id: str) -> None:
        """Register the sequence's prompt blocks that are now full (their tokens are computed in the
        step being planned) so later sequences can hit them."""
        prompt, table = self._prompt_of[request_id], self.tables[request_id]
        done = min(self.num_tokens_of[request_id], len(prompt)) // self.block_size
        start = self._hashed[request_id]
        if done > start:
            hashes, tokens = self.block_chain(prompt, done)
            for b in range(start, done):
                self._cache(table[b], hashes[b], tokens[b])
            self._hashed[request_id] = done
        # every full prompt block is hashed: no more to do
        if done >= len(prompt) // self.block_size:
            del self._prompt_of[request_id]

    def rollback(self, request_id: str, num_tokens: int) -> None:
        """Give back the room and blocks of the sequence's last ``num_tokens`` (rejected drafts)."""
        if not 0 <= num_tokens <= (held := self.num_tokens_of[request_id]):
            raise ValueError(f"request {request_id!r}: rollback of num_tokens={num_tokens}; "
                             f"must be in 0..{held}")
        held -= num_tokens
        table, keep = self.tables[request_id], blocks_for(held, self.block_size)
        self._unreference(reversed(table[keep:]))
        del table[keep:]
        self.num_tokens_of[request_id] = held
        self._room[request_id] = min(self._room[request_id], len(table) * self.block_size)

    # --- release ----------------------------------------------------------------------------------
    def free(self, request_id: str) -> None:
        """Drop the sequence's references. A block nobody holds becomes free; its tail blocks
        first, so a shared prompt's head blocks are the last of them to be evicted."""
        try:
            table = self.tables.pop(request_id)
        except KeyError:
            raise KeyError(f"request {request_id!r} holds no KV blocks (freed twice?)") from None
        del self.num_tokens_of[request_id], self._room[request_id]
        self._prompt_of.pop(request_id, None)
        self._hashed.pop(request_id, None)
        self._unreference(reversed(table))

    def __repr__(self) -> str:
        return (f"BlockManager({self.used_blocks}/{self.num_blocks} blocks of {self.block_size} "
                f"used, seqs={len(self.tables)}, cached={self.num_cached_blocks}, "
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
        if not kv.num_tokens_of[rid] <= kv._room[rid] <= len(table) * kv.block_size:
            raise AssertionError(f"request {rid!r}: room {kv._room[rid]} outside its "
                                 f"{kv.num_tokens_of[rid]} tokens and its {len(table)} blocks")
        for b in table:
            counts[b] += 1
    if counts != kv.ref_count:
        raise AssertionError("reference counts do not match the block tables")
    free = [b for b in range(kv.num_blocks) if counts[b] == 0]
    if sorted(kv.free_uncached + list(kv.free_cached)) != free:
        raise AssertionError("the free blocks are not exactly the unreferenced blocks")
    if any(kv.block_hash[b] is None for b in kv.free_cached) or any(kv.block_hash[b] is not None
                                                                   for b in kv.free_uncached):
        raise AssertionError("a free block is filed as cached when it caches nothing, "
                             "or the reverse")
    for h, b in kv.hash_to_block.items():
        if kv.block_hash[b] != h:
            raise AssertionError(f"block {b} is cached under a hash it does not carry")
