"""What the replicas report to the router (``router.ReplicaReports``), read from the simulation.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

from batchlab.cluster.replica import Replica
from batchlab.kv_blocks import BlockManager


def stored_blocks(kv: object, hashes: Sequence[int], max_blocks: int | None = None) -> int:
    """Leading blocks of a prompt (its chained block ``hashes``) that ``kv`` stores now; 0 for a
    cache without prefix caching. ``max_blocks`` caps the count (a prompt's last token is
    always computed, so a replica can reuse at most ``(prompt_len - 1) // block_size`` blocks)."""
    if not isinstance(kv, BlockManager) or not kv.enable_prefix_caching:
        return 0
    table = kv.hash_to_block
    n = len(hashes) if max_blocks is None else min(len(hashes), max_blocks)
    for i in range(n):
        if hashes[i] not in table:
            return i
    return n


def common_block_size(replicas: Sequence[Replica]) -> int | None:
    """The replicas' KV block size, if they all have the same paged cache; else None."""
    sizes = {r.engine.backend.kv.block_size for r in replicas}
    return sizes.pop() if len(sizes) == 1 else None


class LiveReports:
    """``ReplicaReports`` over the cluster's replicas (see the module docstring)."""

    def __init__(self, replicas: Sequence[Replica]) -> None:
        self.replicas = list(replicas)
        self.block_size = common_block_size(self.replicas)
        self.now = 0.0
        self._waiting = [0] * len(self.replicas)
        self._load = [0] * len(self.replicas)
        self._kv_usage = [0.0] * len(self.replicas)
        self.num_scrapes = 0

    def scrape(self, t: float) -> None:
        """Read every live replica's queue depth, load (running + waiting) and KV usage as of
        ``t``."""
        for rep in self.replicas:
            if not rep.alive:
                continue
            rep.advance_to(t)
            rep.sync()
            scheduler, kv = rep.engine.scheduler, rep.engine.backend.kv
            self._waiting[rep.index] = len(scheduler.waiting)
            self._load[rep.index] = self._waiting[rep.index] + len(scheduler.running_requests())
            self._kv_usage[rep.index] = kv.used_tokens / kv.capacity_tokens
        self.num_scrapes += 1

    def waiting(self, replica: int) -> int:
        return self._waiting[replica]

    def load(self, replica: int) -> int:
        return self._load[replica]

    def kv_usage(self, replica: int) -> float:
        return self._kv_usage[replica]

    def stored_blocks(self, replica: int, hashes: Sequence[int]) -> int:
        rep = self.replicas[replica]
        rep.sync()                  # pending decode steps may have evicted cached blocks
        return stored_blocks(rep.engine.backend.kv, hashes)


__all__ = ["LiveReports", "common_block_size", "stored_blocks"]
