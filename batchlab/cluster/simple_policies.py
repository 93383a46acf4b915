"""Routing policies that look at no prompt: round robin, random, least outstanding requests,
power of two choices, and consistent hashing on a session or prefix key.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

import bisect
import hashlib
from array import array
from dataclasses import dataclass

from batchlab.checks import check_int, check_number
from batchlab.cluster.router import ReplicaReports, RouteRequest, Routed, Router

VIRTUAL_NODES_PER_REPLICA = 160      # vllm-router's src/policies/consistent_hash.rs


class RoundRobinRouter(Router):
    name = "round_robin"

    def __init__(self, num_replicas: int, seed: int = 0) -> None:
        super().__init__(num_replicas, seed)
        self.counter = 0

    def choose(self, req: RouteRequest, reports: ReplicaReports) -> Routed:
        replica = self.alive[self.counter % len(self.alive)]
        self.counter += 1
        return Routed(replica, "round_robin")


class RandomRouter(Router):
    name = "random"

    def choose(self, req: RouteRequest, reports: ReplicaReports) -> Routed:
        return Routed(self.rng.choice(self.alive), "random")


class LeastOutstandingRouter(Router):
    name = "least_outstanding"

    def choose(self, req: RouteRequest, reports: ReplicaReports) -> Routed:
        fewest = min(self.in_flight[r] for r in self.alive)
        tied = [r for r in self.alive if self.in_flight[r] == fewest]
        return Routed(tied[0] if len(tied) == 1 else self.rng.choice(tied), "least_outstanding")


VLLM_ROUTER_LOAD_POLL_S = 30.0      # vllm-router's --worker-startup-check-interval default


@dataclass(frozen=True)
class PowerOfTwoConfig:
    """Which load two replicas are compared on: ``"in_flight"`` (the router's own exact count, the
    idealised rule) or ``"polled"`` (each replica's reported load as of the last poll, every
    ``poll_interval_s``: vllm-router's view)."""

    load: str = "in_flight"
    poll_interval_s: float = VLLM_ROUTER_LOAD_POLL_S

    def __post_init__(self) -> None:
        if self.load not in ("in_flight", "polled"):
            raise ValueError(f"load={self.load!r}; must be 'in_flight' (the router's own count) "
                             "or 'polled' (the replicas' reports, as vllm-router reads /get_load)")
        check_number("poll_interval_s", self.poll_interval_s, strict=True,
                     hint="seconds between polls")


class PowerOfTwoRouter(Router):
    name = "power_of_two"

    def __init__(self, num_replicas: int, seed: int = 0,
                 config: PowerOfTwoConfig | None = None) -> None:
        super().__init__(num_replicas, seed)
        self.config = config or PowerOfTwoConfig()
        if self.config.load == "polled":
            self.metrics_interval_s = self.config.poll_interval_s

    def choose(self, req: RouteRequest, reports: ReplicaReports) -> Routed:
        if len(self.alive) == 1:
            return Routed(self.alive[0], "only_replica")
        first, second = self.rng.sample(self.alive, 2)
        load = self.in_flight.__getitem__ if self.config.load == "in_flight" else reports.load
        chosen = first if load(first) <= load(second) else second
        return Routed(chosen, "power_of_two")


def stable_hash(data: bytes) -> int:
    """A 64-bit hash that is the same in every process (Python's ``hash`` of ``str`` is not)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@dataclass(frozen=True)
class ConsistentHashConfig:
    """``key``: ``"session"`` (the session when the request has one, else the prefix) or
    ``"prefix"`` (always the prompt's first ``prefix_tokens`` tokens)."""

    key: str = "session"
    prefix_tokens: int = 256
    virtual_nodes: int = VIRTUAL_NODES_PER_REPLICA

    def __post_init__(self) -> None:
        if self.key not in ("session", "prefix"):
            raise ValueError(f"key={self.key!r}; must be 'session' or 'prefix'")
        check_int("prefix_tokens", self.prefix_tokens)
        check_int("virtual_nodes", self.virtual_nodes)


class ConsistentHashRouter(Router):
    name = "consistent_hash"

    def __init__(self, num_replicas: int, seed: int = 0,
                 config: ConsistentHashConfig | None = None) -> None:
        super().__init__(num_replicas, seed)
        self.config = config or ConsistentHashConfig()
        self._build_ring()

    def _build_ring(self) -> None:
        points = sorted((stable_hash(f"replica-{r}:{i}".encode()), r)
                        for r in self.alive for i in range(self.config.virtual_nodes))
        self.ring_points = [p for p, _ in points]
        self.ring_replicas = [r for _, r in points]

    def key_of(self, req: RouteRequest) -> tuple[bytes, str]:
        """The bytes hashed for ``req``, and which key they are (session, prefix, request id)."""
        if self.config.key == "session" and req.session is not None:
            return req.session.encode(), "session"
        if req.prompt_ids is not None:
            return array("q", req.prompt_ids[:self.config.prefix_tokens]).tobytes(), "prefix"
        return req.request_id.encode(), "request_id"

    def choose(self, req: RouteRequest, reports: ReplicaReports) -> Routed:
        key, kind = self.key_of(req)
        i = bisect.bisect_left(self.ring_points, stable_hash(key)) % len(self.ring_points)
        return Routed(self.ring_replicas[i], f"hash_{kind}")

    def replica_died(self, replica: int) -> None:
        super().replica_died(replica)
        if self.alive:
            self._build_ring()


__all__ = ["ConsistentHashConfig", "ConsistentHashRouter", "LeastOutstandingRouter",
           "PowerOfTwoConfig",
           "PowerOfTwoRouter", "RandomRouter", "RoundRobinRouter", "VIRTUAL_NODES_PER_REPLICA",
           "VLLM_ROUTER_LOAD_POLL_S", "stable_hash"]
