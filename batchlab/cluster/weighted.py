"""Weighted scoring as llm-d's inference scheduler does it: prefix, queue and KV-usage scorers.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchlab.checks import check_int, check_number
from batchlab.cluster.prefix_index import PrefixIndex
from batchlab.cluster.router import ReplicaReports, RouteRequest, Routed, Router
from batchlab.kv_blocks import DEFAULT_BLOCK_SIZE

GIE_METRICS_INTERVAL_S = 0.05      # GIE's DefaultRefreshMetricsInterval (50 ms)


@dataclass(frozen=True)
class WeightedConfig:
    """Scorer weights (llm-d's defaults 3 / 2 / 2) and the prefix index's and scraper's sizes."""

    prefix_weight: float = 3.0
    queue_weight: float = 2.0
    kv_weight: float = 2.0
    hash_block_tokens: int = DEFAULT_BLOCK_SIZE
    max_prefix_blocks: int = 256
    lru_capacity_blocks: int = 31_250
    metrics_interval_s: float = GIE_METRICS_INTERVAL_S

    def __post_init__(self) -> None:
        for name in ("prefix_weight", "queue_weight", "kv_weight"):
            check_number(name, getattr(self, name))
        if self.prefix_weight + self.queue_weight + self.kv_weight == 0:
            raise ValueError("prefix_weight, queue_weight and kv_weight are all 0; "
                             "give at least one weight > 0")
        check_int("hash_block_tokens", self.hash_block_tokens)
        check_int("max_prefix_blocks", self.max_prefix_blocks)
        check_int("lru_capacity_blocks", self.lru_capacity_blocks)
        check_number("metrics_interval_s", self.metrics_interval_s, strict=True)


class WeightedScorerRouter(Router):
    name = "weighted"

    def __init__(self, num_replicas: int, seed: int = 0,
                 config: WeightedConfig | None = None) -> None:
        super().__init__(num_replicas, seed)
        self.config = config or WeightedConfig()
        self.metrics_interval_s = self.config.metrics_interval_s
        self.index = PrefixIndex(num_replicas, self.config.hash_block_tokens)

    def _hashes(self, req: RouteRequest) -> list[int]:
        return req.hashes(self.config.hash_block_tokens, self.config.max_prefix_blocks)

    def scores(self, req: RouteRequest,
               reports: ReplicaReports) -> dict[int, tuple[float, float, float]]:
        """``(prefix, queue, kv)`` scores of every alive replica, each in [0, 1]."""
        hashes = self._hashes(req)
        return self._scores(self.index.longest_matches(hashes)[0], len(hashes), reports)

    def _scores(self, depth: dict[int, int], num_blocks: int,
                reports: ReplicaReports) -> dict[int, tuple[float, float, float]]:
        queues = {r: reports.waiting(r) for r in self.alive}
        low, high = min(queues.values()), max(queues.values())
        return {r: (depth.get(r, 0) / num_blocks if num_blocks else 0.0,
                    1.0 if high == low else (high - queues[r]) / (high - low),
                    1.0 - reports.kv_usage(r)) for r in self.alive}

    def choose(self, req: RouteRequest, reports: ReplicaReports) -> Routed:
        c, hashes = self.config, self._hashes(req)
        depth, _ = self.index.longest_matches(hashes)
        totals = {r: c.prefix_weight * p + c.queue_weight * q + c.kv_weight * k
                  for r, (p, q, k) in self._scores(depth, len(hashes), reports).items()}
        best = max(totals.values())
        tied = [r for r, total in totals.items() if total == best]
        chosen = tied[0] if len(tied) == 1 else self.rng.choice(tied)
        return Routed(chosen, "max_score", depth.get(chosen, 0) * c.hash_block_tokens)

    def sent(self, req: RouteRequest, replica: int, reports: ReplicaReports) -> None:
        self.index.insert(self._hashes(req), replica)
        self.index.prune(replica, self.config.lru_capacity_blocks)

    def replica_died(self, replica: int) -> None:
        super().replica_died(replica)
        self.index.drop(replica)


__all__ = ["GIE_METRICS_INTERVAL_S", "WeightedConfig", "WeightedScorerRouter"]
