"""The real router against the simulation: the same workload over ``vllm-router`` on loopback and
through ``batchlab.cluster``'s in-process twin, and the router's own added latency.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

import numpy as np

from batchlab.analysis.metrics import per_request_metrics
from batchlab.cluster import Cluster, ClusterConfig, ReplicaSpec
from batchlab.loadgen import run_load
from batchlab.loadgen.client import LoadRequest, from_workload
from batchlab.requests import Request
from batchlab.launch.loopback import LoopbackCluster, LoopbackConfig
from batchlab.loadgen.prom import counter_delta, scrape

HIT_FAMILIES = ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries")


def in_process_twin(config: LoopbackConfig, seed: int = 0, policy: str | None = None) -> Cluster:
    """The in-process ``Cluster`` that ``config`` stands for (see the module docstring), with
    ``policy`` instead of the config's when given."""
    spec = ReplicaSpec(config.device().cost_model, config.kv_capacity_tokens(),
                       config.replica.engine)
    return Cluster(ClusterConfig(config.num_replicas, policy or config.policy, seed=seed), spec)


def _hits(urls: list[str]) -> list:
    return [scrape(u) for u in urls]


def serve_through_router(lb: LoopbackCluster, requests: list[Request]) -> dict:
    """Send ``requests`` through the router (open loop, their arrival times; streamed, token-id
    prompts, ``ignore_eos``): TTFT p50/p90 at the client, prefix hits from the replicas."""
    before = _hits(lb.replica_urls)
    result = run_load(lb.url, from_workload(requests), mode="open", request_timeout=120.0)
    after = _hits(lb.replica_urls)
    hits, queries = (sum(counter_delta(b, a, f) for b, a in zip(before, after))
                     for f in HIT_FAMILIES)
    df = per_request_metrics(result.trace)
    errors = [r for r in result.records if r.error]
    return {"ttft_p50_s": float(df["ttft"].median()), "ttft_p90_s": float(df["ttft"].quantile(0.9)),
            "ttft_s": df["ttft"].to_numpy(),
            "prefix_hit_share": hits / queries if queries else float("nan"),
            "num_errors": len(errors), "num_requests": len(result.records),
            "wall_s": result.wall_seconds}


def serve_in_process(config: LoopbackConfig, requests: list[Request], seed: int = 0,
                     policy: str | None = None) -> dict:
    """The same numbers from the in-process twin (virtual clock)."""
    result = in_process_twin(config, seed, policy).run(requests)
    df = per_request_metrics(result.merged)
    return {"ttft_p50_s": float(df["ttft"].median()), "ttft_p90_s": float(df["ttft"].quantile(0.9)),
            "ttft_s": df["ttft"].to_numpy(),
            "prefix_hit_share": result.hit_summary()["admitted_hit_share"],
            "num_errors": len(requests) - len(df), "num_requests": len(requests)}


def agreement(router: dict, cluster: dict) -> dict:
    """TTFT p50's relative difference and the prefix-hit shares' difference in points."""
    return {"ttft_p50_rel_diff": router["ttft_p50_s"] / cluster["ttft_p50_s"] - 1,
            "prefix_hit_points_diff": 100 * (router["prefix_hit_share"]
                                             - cluster["prefix_hit_share"])}


def router_added_latency(lb: LoopbackCluster, prompt_len: int = 256, max_tokens: int = 4,
                         rounds: int = 10) -> dict:
    """TTFT medians one request at a time, straight to replica 0 and through the router,
    alternating (so drift in the machine's speed hits both); the difference is the router's."""
    direct, routed = [], []
    rng = np.random.default_rng(0)
    for i in range(rounds):
        for url, into in ((lb.replica_urls[0], direct), (lb.url, routed)):
            # fresh: no prefix hit either way
            prompt = rng.integers(100, 40_000, prompt_len).tolist()
            result = run_load(url, [LoadRequest(f"lat{i}", prompt, max_tokens)], mode="closed",
                              concurrency=1)
            into.append(float(per_request_metrics(result.trace)["ttft"].iloc[0]))
    d, r = float(np.median(direct)), float(np.median(routed))
    return {"direct_ttft_p50_s": d, "router_ttft_p50_s": r, "router_added_s": r - d}


__all__ = ["agreement", "in_process_twin", "router_added_latency", "serve_in_process",
           "serve_through_router"]
