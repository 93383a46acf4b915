"""Cache-aware routing as vllm-router and SGLang's router do it: prefix affinity unless the load
is out of balance.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchlab.checks import check_int, check_number
from batchlab.cluster.prefix_index import PrefixIndex
from batchlab.cluster.router import ReplicaReports, RouteRequest, Routed, Router
from batchlab.kv_blocks import DEFAULT_BLOCK_SIZE


@dataclass(frozen=True)
class CacheAwareConfig:
    """The cache-aware rule's knobs, with vllm-router's defaults (see the module docstring)."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_s: float = 120.0
    max_tree_tokens: int = 2**26
    block_tokens: int = DEFAULT_BLOCK_SIZE

    def __post_init__(self) -> None:
        check_number("cache_threshold", self.cache_threshold)
        if self.cache_threshold > 1:
            raise ValueError(f"cache_threshold={self.cache_threshold!r}; must be in [0, 1] "
                             "(a match ratio)")
        check_int("balance_abs_threshold", self.balance_abs_threshold, minimum=0)
        check_number("balance_rel_threshold", self.balance_rel_threshold, hint="a ratio of loads")
        check_number("eviction_interval_s", self.eviction_interval_s, strict=True)
        check_int("max_tree_tokens", self.max_tree_tokens, minimum=0)
        check_int("block_tokens", self.block_tokens, hint="the router's tree matches whole blocks")


class CacheAwareRouter(Router):
    name = "cache_aware"

    def __init__(self, num_replicas: int, seed: int = 0,
                 config: CacheAwareConfig | None = None) -> None:
        super().__init__(num_replicas, seed)
        self.config = config or CacheAwareConfig()
        self.tree = PrefixIndex(num_replicas, self.config.block_tokens)
        self.next_eviction = self.config.eviction_interval_s
        self.num_pruned_blocks = 0

    def is_imbalanced(self) -> bool:
        """Step 1 of the rule: both thresholds exceeded."""
        loads = [self.in_flight[r] for r in self.alive]
        low, high = min(loads), max(loads)
        return (high - low > self.config.balance_abs_threshold
                and high > low * self.config.balance_rel_threshold)

    def choose(self, req: RouteRequest, reports: ReplicaReports) -> Routed:
        self._prune_if_due(reports.now)
        cfg = self.config
        depth, best = self.tree.longest_matches(req.hashes(cfg.block_tokens))
        if self.is_imbalanced():
            chosen = self.least_loaded()
            return Routed(chosen, "load_balance", depth.get(chosen, 0) * cfg.block_tokens)
        matched = depth.get(best, 0) * cfg.block_tokens if best is not None else 0
        if best is not None and matched / req.prompt_len > cfg.cache_threshold:
            return Routed(best, "cache_affinity", matched)
        chosen = self.least_loaded()
        return Routed(chosen, "low_match_min_load", depth.get(chosen, 0) * cfg.block_tokens)

    def sent(self, req: RouteRequest, replica: int, reports: ReplicaReports) -> None:
        self.tree.insert(req.hashes(self.config.block_tokens), replica)

    def _prune_if_due(self, now: float) -> None:
        """Step 3: the periodic pruning of every replica's tree."""
        if now < self.next_eviction:
            return
        keep = self.config.max_tree_tokens // self.config.block_tokens
        for r in self.alive:
            self.num_pruned_blocks += self.tree.prune(r, keep)
        interval = self.config.eviction_interval_s
        self.next_eviction = (now // interval + 1) * interval

    def replica_died(self, replica: int) -> None:
        super().replica_died(replica)
        self.tree.drop(replica)


__all__ = ["CacheAwareConfig", "CacheAwareRouter"]
