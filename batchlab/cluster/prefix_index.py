"""A router's own, approximate picture of which prompt prefixes each replica holds.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from batchlab.checks import check_int


def block_hashes(prompt_ids: Sequence[int] | None, block_tokens: int,
                 max_blocks: int | None = None) -> list[int]:
    """Chained hashes of the prompt's full blocks of ``block_tokens`` tokens (at most
    ``max_blocks``): ``h_i = hash((h_{i-1}, tokens of block i))``, the rule of ``kv_blocks``.
    Integers only, so the values are the same in every process (no string hashing)."""
    if prompt_ids is None:
        return []
    n = len(prompt_ids) // block_tokens
    if max_blocks is not None:
        n = min(n, max_blocks)
    out: list[int] = []
    parent = None
    for b in range(n):
        parent = hash((parent, tuple(prompt_ids[b * block_tokens:(b + 1) * block_tokens])))
        out.append(parent)
    return out


class PrefixIndex:
    """Which replicas (may) hold each prompt block, and each replica's blocks in LRU order."""

    def __init__(self, num_replicas: int, block_tokens: int) -> None:
        check_int("num_replicas", num_replicas)
        check_int("block_tokens", block_tokens)
        self.block_tokens = block_tokens
        self.holders: dict[int, dict[int, None]] = {}     # block hash -> replicas, most recent last
        self.recency: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_replicas)]

    def num_blocks(self, replica: int) -> int:
        return len(self.recency[replica])

    def longest_matches(self, hashes: Sequence[int]) -> tuple[dict[int, int], int | None]:
        """``({replica: leading blocks of hashes it holds}, best)`` for replicas holding at least
        one; ``best`` holds the most blocks (the one that was sent that prefix last, on a tie)."""
        depth: dict[int, int] = {}
        active: set[int] | None = None
        last: dict[int, None] = {}
        for i, h in enumerate(hashes):
            holders = self.holders.get(h)
            still = set() if holders is None else (set(holders) if active is None
                                                   else active & holders.keys())
            for r in (active or set()) - still:
                depth[r] = i
            if not still:
                return depth, self._most_recent(last, active)
            active, last = still, holders
        for r in active or ():
            depth[r] = len(hashes)
        return depth, self._most_recent(last, active)

    @staticmethod
    def _most_recent(holders: dict[int, None], candidates: set[int] | None) -> int | None:
        return next((r for r in reversed(holders) if r in candidates), None) if candidates else None

    def insert(self, hashes: Sequence[int], replica: int) -> None:
        """``replica`` was sent a prompt with these blocks: it holds them now, most recent first."""
        recency = self.recency[replica]
        for h in reversed(hashes):            # the first block touched last: the last to be pruned
            holders = self.holders.get(h)
            if holders is None:
                self.holders[h] = {replica: None}
            else:
                holders.pop(replica, None)
                holders[replica] = None
            recency[h] = None
            recency.move_to_end(h)

    def prune(self, replica: int, keep_blocks: int) -> int:
        """Forget ``replica``'s least recently used blocks until it holds ``keep_blocks``; return
        how many were forgotten."""
        recency, forgotten = self.recency[replica], 0
        while len(recency) > keep_blocks:
            h, _ = recency.popitem(last=False)
            holders = self.holders[h]
            del holders[replica]
            if not holders:
                del self.holders[h]
            forgotten += 1
        return forgotten

    def drop(self, replica: int) -> None:
        """Forget everything about ``replica`` (it left the cluster)."""
        self.prune(replica, 0)


__all__ = ["PrefixIndex", "block_hashes"]
