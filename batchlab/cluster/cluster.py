"""``Cluster``: N replicas behind a router, run over a workload on one virtual clock.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from batchlab.checks import check_int, check_number, is_int
from batchlab.cluster.driver import ClusterRun
from batchlab.cluster.policies import ROUTING_POLICIES, check_policy, make_router
from batchlab.cluster.replica import Replica, ReplicaSpec
from batchlab.cluster.results import ClusterResult, build_result
from batchlab.contract import fresh_workload
from batchlab.engine import Engine
from batchlab.loop import gc_paused
from batchlab.requests import Request


@dataclass(frozen=True)
class ClusterConfig:
    """How many replicas, which routing policy (one of ``ROUTING_POLICIES``) with which parameters
    (the fields of its config dataclass, e.g. ``{"cache_threshold": 0.5}``), and the router's
    seed."""

    num_replicas: int
    policy: str = "cache_aware"
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("num_replicas", self.num_replicas, hint="a cluster needs at least one replica")
        check_policy(self.policy)
        if not isinstance(self.policy_params, Mapping):
            raise ValueError(f"policy_params={self.policy_params!r}; must be a dict of the "
                             "policy's parameters")
        check_int("seed", self.seed, minimum=0)
        # checks the params
        make_router(self.policy, self.num_replicas, self.seed, self.policy_params)


class Cluster:
    """Replicas built from ``replica`` (a ``ReplicaSpec``), or by ``engine_factory(i)`` (any
    ``Engine`` on the virtual clock, e.g. another scheduler), behind ``config.policy``."""

    def __init__(self, config: ClusterConfig, replica: ReplicaSpec | None = None,
                 engine_factory: Callable[[int], Engine] | None = None) -> None:
        if not isinstance(config, ClusterConfig):
            raise ValueError(f"config={config!r}; must be a ClusterConfig")
        if (replica is None) == (engine_factory is None):
            raise ValueError("give exactly one of replica= (a ReplicaSpec) and "
                             "engine_factory= (index -> Engine)")
        if replica is not None and not isinstance(replica, ReplicaSpec):
            raise ValueError(f"replica={replica!r}; must be a ReplicaSpec")
        self.config = config
        self.engine_factory = engine_factory or replica.build
        self.replica_spec = replica
        self.kills: list[tuple[float, int]] = []

    def __repr__(self) -> str:
        c = self.config
        return f"Cluster({c.num_replicas} replicas, policy={c.policy!r}, kills={self.kills})"

    def kill(self, replica: int, at: float) -> None:
        """Replica ``replica`` dies at time ``at`` in every later run: the step it is running
        completes, its unfinished requests are aborted with that reason, the router avoids it."""
        if not is_int(replica) or not 0 <= replica < self.config.num_replicas:
            raise ValueError(f"replica={replica!r}; must be an int in "
                             f"0..{self.config.num_replicas - 1}")
        check_number("at", at, hint="seconds on the run's clock")
        self.kills.append((float(at), int(replica)))

    def run(self, requests: Sequence[Request],
            session_of: Mapping[str, str] | None = None) -> ClusterResult:
        """Serve ``requests`` (sorted by arrival, unique ids; not modified) to the end.
        ``session_of``: request id -> session key, as a client would send it (for routing only)."""
        workload = fresh_workload(requests)
        c = self.config
        router = make_router(c.policy, c.num_replicas, c.seed, c.policy_params)
        replicas = [Replica(i, self._engine(i)) for i in range(c.num_replicas)]
        run = ClusterRun(replicas, router, workload, dict(session_of or {}), self.kills)
        wall_start = time.perf_counter()
        with gc_paused():     # as the offline driver: millions of small objects, no cycles
            run.run()
            result = build_result(run, {"policy": c.policy, "policy_params": dict(c.policy_params),
                                        "router": repr(router), "seed": c.seed,
                                        "kills": list(self.kills)})
        result.meta["wall_seconds"] = result.merged.meta["wall_seconds"] = (
            time.perf_counter() - wall_start)
        return result

    def _engine(self, index: int) -> Engine:
        engine = self.engine_factory(index)
        if not isinstance(engine, Engine):
            raise ValueError(f"engine_factory({index}) returned {engine!r}, not an Engine")
        return engine


__all__ = ["ROUTING_POLICIES", "Cluster", "ClusterConfig"]
