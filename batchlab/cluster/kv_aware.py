"""KV-aware routing as NVIDIA Dynamo's KV router does it: the cheapest replica by a cost that
counts the prompt work a replica's cache would save and the KV load it already carries.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from batchlab.checks import check_number
from batchlab.cluster.router import ReplicaReports, RouteRequest, Routed, Router


@dataclass(frozen=True)
class KVAwareConfig:
    """Dynamo's knobs: ``overlap_score_weight`` (default 1.0), ``temperature`` (default 0.0)."""

    overlap_score_weight: float = 1.0
    temperature: float = 0.0

    def __post_init__(self) -> None:
        check_number("overlap_score_weight", self.overlap_score_weight)
        check_number("temperature", self.temperature, hint="0 = always the lowest cost")


class KVAwareRouter(Router):
    name = "kv_aware"
    needs_kv_events = True
    needs_first_tokens = True

    def __init__(self, num_replicas: int, seed: int = 0,
                 config: KVAwareConfig | None = None) -> None:
        super().__init__(num_replicas, seed)
        self.config = config or KVAwareConfig()
        self.active_blocks = [0] * num_replicas     # decode blocks: requests being served
        self.prefill_blocks = [0] * num_replicas    # prompt blocks not yet computed
        self.tracked: dict[str, list[int]] = {}     # request -> [replica, blocks, prefill share]
        self._overlap: dict[int, int] = {}          # the last choice's overlaps, for ``sent``

    def costs(self, req: RouteRequest, reports: ReplicaReports) -> dict[int, float]:
        """``cost(w)`` for every alive replica (see the module docstring)."""
        block_size = reports.block_size or 1
        hashes = req.hashes(block_size) if reports.block_size else []
        prompt_blocks = math.ceil(req.prompt_len / block_size)
        reusable = (req.prompt_len - 1) // block_size     # a prompt's last token is always computed
        self._overlap = {r: min(reports.stored_blocks(r, hashes), reusable) if hashes else 0
                         for r in self.alive}
        w = self.config.overlap_score_weight
        return {r: w * (self.prefill_blocks[r] + prompt_blocks - self._overlap[r])
                + self.active_blocks[r] + prompt_blocks for r in self.alive}

    def choose(self, req: RouteRequest, reports: ReplicaReports) -> Routed:
        costs = self.costs(req, reports)
        chosen = self._pick(costs)
        return Routed(chosen, "lowest_cost" if self.config.temperature == 0 else "softmax_cost",
                      self._overlap[chosen] * (reports.block_size or 0))

    def _pick(self, costs: dict[int, float]) -> int:
        """The lowest cost (a random one of the tied), or a softmax draw over normalised costs."""
        low, high = min(costs.values()), max(costs.values())
        if self.config.temperature == 0 or high == low:
            tied = [r for r, c in costs.items() if c == low]
            return tied[0] if len(tied) == 1 else self.rng.choice(tied)
        replicas = list(costs)
        weights = [math.exp(-(costs[r] - low) / (high - low) / self.config.temperature)
                   for r in replicas]
        return self.rng.choices(replicas, weights)[0]

    def sent(self, req: RouteRequest, replica: int, reports: ReplicaReports) -> None:
        prompt_blocks = math.ceil(req.prompt_len / (reports.block_size or 1))
        prefill = prompt_blocks - self._overlap.get(replica, 0)
        self.active_blocks[replica] += prompt_blocks
        self.prefill_blocks[replica] += prefill
        self.tracked[req.request_id] = [replica, prompt_blocks, prefill]

    def first_token(self, request_id: str, replica: int, t: float) -> None:
        entry = self.tracked.get(request_id)
        if entry is not None and entry[2]:
            self.prefill_blocks[replica] -= entry[2]
            entry[2] = 0

    def request_ended(self, request_id: str, replica: int, t: float) -> None:
        super().request_ended(request_id, replica, t)
        entry = self.tracked.pop(request_id, None)
        if entry is not None:
            self.active_blocks[replica] -= entry[1]
            self.prefill_blocks[replica] -= entry[2]


__all__ = ["KVAwareConfig", "KVAwareRouter"]
