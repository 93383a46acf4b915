"""Past one machine: many replicas of an engine behind a router, on one virtual clock.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from batchlab.cluster.cluster import Cluster, ClusterConfig
from batchlab.cluster.disaggregated import (KV_LINKS, DisaggregatedCluster, DisaggregatedConfig,
                                            DisaggregatedResult, KVLink)
from batchlab.cluster.policies import ROUTING_POLICIES, make_router
from batchlab.cluster.replica import ReplicaSpec
from batchlab.cluster.results import ClusterResult
from batchlab.cluster.router import ReplicaReports, RouteRequest, Routed, Router

__all__ = ["KV_LINKS", "ROUTING_POLICIES", "Cluster", "ClusterConfig", "ClusterResult",
           "DisaggregatedCluster",
           "DisaggregatedConfig", "DisaggregatedResult", "KVLink", "ReplicaReports", "ReplicaSpec",
           "RouteRequest", "Routed", "Router", "make_router"]
