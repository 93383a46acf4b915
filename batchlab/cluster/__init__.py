"""Past one machine: many replicas of an engine behind a router, on one virtual clock.

One engine batches requests on one device. A service runs many such replicas and puts a router
in front of them, and the router decides which replica's batch and which replica's KV cache
each request lands in. With prefix caching that choice decides whether a prompt is computed
again or found cached, and whether one replica drowns in a hot prefix while others idle. The
routers in use differ exactly there (round robin, power of two choices, consistent hashing,
vllm-router's and SGLang's cache-aware rule, NVIDIA Dynamo's KV cost, llm-d's weighted scorers),
and this folder simulates them over many ``Engine``s, so their effects can be measured.

- ``router``           what a router sees and decides (``Router``, ``Routed``, ``ReplicaReports``)
- ``simple_policies``  round robin, random, least outstanding, power of two, consistent hash
- ``cache_aware``      vllm-router / SGLang's cache-aware rule, with their thresholds
- ``kv_aware``         Dynamo's KV router cost (prefix overlap from KV events + KV load)
- ``weighted``         llm-d's weighted prefix / queue / KV-usage scorers
- ``prefix_index``     a router's own approximate view of each replica's prefixes
- ``policies``         the policies by name: ``ROUTING_POLICIES``, ``make_router``
- ``replica``          ``ReplicaSpec`` (how each replica is built) and ``Replica`` (one stepped engine)
- ``lazy_runs``        the simulator's fast path, adapted to many engines on one clock
- ``reports``          what replicas report: scraped metrics, KV events
- ``driver``           the event loop: arrivals routed at their time, replicas advanced in step
- ``results``          ``ClusterResult``: per-replica traces, a merged trace, the routing table
- ``cluster``          ``Cluster`` and ``ClusterConfig``: the one call to run it all
- ``disaggregated``    prefill and decode pools, the KV handed over a link (``DisaggregatedCluster``)
- ``pd_goodput``       the same GPUs colocated or split: DistServe's goodput of each layout
- ``sweep``            pure, seeded runs over a grid of settings, in process or on Ray
- ``loopback``         the real router (``vllm-router``) on 127.0.0.1 in front of N batchlab servers
                       on simulated devices
- ``router_check``     the real router against this folder's simulation of it: its picks, its latency

Why a folder: the cluster sits above one engine (it drives many), and its routers are a policy
family of their own, as the batching policies in ``schedulers/`` are for one engine. It sits above
the server too: the real router's experiments start servers and load them from outside.
"""

from batchlab.cluster.cluster import Cluster, ClusterConfig
from batchlab.cluster.disaggregated import (KV_LINKS, DisaggregatedCluster, DisaggregatedConfig, DisaggregatedResult,
                                            KVLink)
from batchlab.cluster.policies import ROUTING_POLICIES, make_router
from batchlab.cluster.replica import ReplicaSpec
from batchlab.cluster.results import ClusterResult
from batchlab.cluster.router import ReplicaReports, RouteRequest, Routed, Router

__all__ = ["KV_LINKS", "ROUTING_POLICIES", "Cluster", "ClusterConfig", "ClusterResult", "DisaggregatedCluster",
           "DisaggregatedConfig", "DisaggregatedResult", "KVLink", "ReplicaReports", "ReplicaSpec", "RouteRequest",
           "Routed", "Router", "make_router"]
