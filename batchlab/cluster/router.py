"""What a router is: it picks a replica for each request from what a real router can know.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from batchlab.checks import check_int
from batchlab.cluster.prefix_index import block_hashes


class NoReplicaAlive(RuntimeError):
    """Every replica has died; the request cannot be routed (the cluster rejects it)."""


@dataclass(frozen=True, slots=True)
class Routed:
    """One routing decision: the replica, the rule that chose it (``reason``, in the router's
    own words, e.g. ``"cache_affinity"``), and the prefix tokens the router believed that
    replica had cached (``None`` for routers that do not look at prefixes)."""

    replica: int
    reason: str
    predicted_hit_tokens: int | None = None


class RouteRequest:
    """What a router sees of a request: its id, prompt tokens (``None`` for simulated requests
    without tokens), prompt length, session key (``None`` if the client sent none), arrival."""

    __slots__ = ("request_id", "prompt_ids", "prompt_len", "session", "arrival_time", "_hashes")

    def __init__(self, request_id: str, prompt_ids: Sequence[int] | None, prompt_len: int,
                 session: str | None, arrival_time: float) -> None:
        self.request_id, self.prompt_ids, self.prompt_len = request_id, prompt_ids, prompt_len
        self.session, self.arrival_time = session, arrival_time
        self._hashes: dict[tuple[int, int | None], list[int]] = {}

    def hashes(self, block_tokens: int, max_blocks: int | None = None) -> list[int]:
        """The prompt's chained block hashes (``prefix_index.block_hashes``), computed once."""
        key = (block_tokens, max_blocks)
        if key not in self._hashes:
            self._hashes[key] = block_hashes(self.prompt_ids, block_tokens, max_blocks)
        return self._hashes[key]


class ReplicaReports(Protocol):
    """What replicas tell the router (see the module docstring); the cluster driver provides it."""

    now: float
    block_size: int | None          # the replicas' KV block size (None: no paged cache)

    def waiting(self, replica: int) -> int:
        """The replica's waiting-queue length, as last scraped."""

    def load(self, replica: int) -> int:
        """The replica's requests running and waiting, as last scraped (what ``/get_load``
        reports)."""

    def kv_usage(self, replica: int) -> float:
        """The fraction of the replica's KV cache in use, as last scraped."""

    def stored_blocks(self, replica: int, hashes: Sequence[int]) -> int:
        """How many leading blocks of a prompt (``hashes`` over ``block_size`` tokens) the
        replica stores now, as its KV events have told the router."""


class Router(ABC):
    """A routing policy. ``choose`` picks a replica; the rest is shared bookkeeping.

    Subclasses say what they read: ``metrics_interval_s`` (scrape replicas' reported metrics at
    this period; ``None``: never), ``needs_kv_events`` (read stored blocks), ``needs_first_tokens``
    (be told when each request's first token arrives).
    """

    name: ClassVar[str] = "router"
    metrics_interval_s: float | None = None
    needs_kv_events: ClassVar[bool] = False
    needs_first_tokens: ClassVar[bool] = False

    def __init__(self, num_replicas: int, seed: int = 0) -> None:
        check_int("num_replicas", num_replicas, hint="a cluster needs at least one replica")
        check_int("seed", seed, minimum=0)
        self.num_replicas = num_replicas
        self.alive: list[int] = list(range(num_replicas))
        self.in_flight = [0] * num_replicas          # sent, not yet answered (the router's count)
        self.rng = random.Random(seed)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_replicas={self.num_replicas})"

    @abstractmethod
    def choose(self, req: RouteRequest, reports: ReplicaReports) -> Routed:
        """Pick one of ``self.alive`` for ``req`` (called only while some replica is alive)."""

    def sent(self, req: RouteRequest, replica: int, reports: ReplicaReports) -> None:
        """``req`` was sent to ``replica``: update what the router remembers (default: nothing)."""

    def route(self, req: RouteRequest, reports: ReplicaReports) -> Routed:
        """Choose, count the request in flight, and remember where it went."""
        if not self.alive:
            raise NoReplicaAlive(f"no replica is alive to take {req.request_id!r}")
        decision = self.choose(req, reports)
        if decision.replica not in self.alive:
            raise RuntimeError(f"{self!r} chose replica {decision.replica}, which is not alive")
        self.in_flight[decision.replica] += 1
        self.sent(req, decision.replica, reports)
        return decision

    def request_ended(self, request_id: str, replica: int, t: float) -> None:
        """The replica answered (or dropped) ``request_id`` at ``t``."""
        self.in_flight[replica] -= 1

    def first_token(self, request_id: str, replica: int, t: float) -> None:
        """``request_id``'s first token came back at ``t`` (only if ``needs_first_tokens``)."""

    def replica_died(self, replica: int) -> None:
        """``replica`` is gone: never route to it again."""
        if replica in self.alive:
            self.alive.remove(replica)

    def least_loaded(self) -> int:
        """The alive replica with the fewest requests in flight (the first one on a tie, as
        vllm-router's ``min_by_key`` over its workers)."""
        return min(self.alive, key=self.in_flight.__getitem__)


__all__ = ["NoReplicaAlive", "ReplicaReports", "RouteRequest", "Routed", "Router"]
