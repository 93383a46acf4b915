"""The routing policies by name, and ``make_router``: one call to build any of them.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from batchlab.cluster.cache_aware import CacheAwareConfig, CacheAwareRouter
from batchlab.cluster.kv_aware import KVAwareConfig, KVAwareRouter
from batchlab.cluster.router import Router
from batchlab.cluster.simple_policies import (
    ConsistentHashConfig, ConsistentHashRouter, LeastOutstandingRouter, PowerOfTwoConfig,
    PowerOfTwoRouter, RandomRouter, RoundRobinRouter,
)
from batchlab.cluster.weighted import WeightedConfig, WeightedScorerRouter

# name -> (router class, its config dataclass or None when it takes no parameters)
ROUTING_POLICIES: dict[str, tuple[type[Router], type | None]] = {
    "round_robin": (RoundRobinRouter, None),
    "random": (RandomRouter, None),
    "least_outstanding": (LeastOutstandingRouter, None),
    "power_of_two": (PowerOfTwoRouter, PowerOfTwoConfig),
    "consistent_hash": (ConsistentHashRouter, ConsistentHashConfig),
    "cache_aware": (CacheAwareRouter, CacheAwareConfig),
    "kv_aware": (KVAwareRouter, KVAwareConfig),
    "weighted": (WeightedScorerRouter, WeightedConfig),
}


def check_policy(policy: object) -> str:
    if policy not in ROUTING_POLICIES:
        raise ValueError(f"policy={policy!r}; must be one of {', '.join(ROUTING_POLICIES)}")
    return policy  # type: ignore[return-value]


def make_router(policy: str, num_replicas: int, seed: int = 0,
                params: Mapping[str, Any] | None = None) -> Router:
    """A new router for ``policy`` over ``num_replicas`` replicas; ``params`` are the fields of
    the policy's config dataclass (e.g. ``{"cache_threshold": 0.5}`` for ``cache_aware``)."""
    router_class, config_class = ROUTING_POLICIES[check_policy(policy)]
    params = dict(params or {})
    if config_class is None:
        if params:
            raise ValueError(f"policy {policy!r} takes no parameters; got {sorted(params)}")
        return router_class(num_replicas, seed)
    try:
        config = config_class(**params)
    except TypeError as err:
        raise ValueError(f"policy {policy!r}: {err} (its parameters are the fields of "
                         f"{config_class.__name__})") from None
    return router_class(num_replicas, seed, config)


__all__ = ["ROUTING_POLICIES", "check_policy", "make_router"]
