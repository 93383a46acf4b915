"""Checkers for notebook 12 (one model, many replicas).

Each checker runs the simulation the exercise describes (the same seeded workload and replicas,
so the expected answer is exact) and compares, once per session (cached). They take a few
seconds (12.1) to about half a minute (12.2), and run only once an answer is given.
"""

from __future__ import annotations

from functools import lru_cache

from batchlab.exercises import Verdict, compare, exercise

SLO_P90 = 1.0
SIZING_REPLICAS = (2, 3, 4, 5, 6, 7, 8)


@lru_cache(maxsize=4)
def mixed_fleet_ratio(session_rate: float = 40.0, num_sessions: int = 800, seed: int = 0) -> float:
    """12.1: round robin's TTFT p99 / least outstanding's on the notebook's mixed fleet."""
    from batchlab.analysis.metrics import per_request_metrics
    from batchlab.cluster import Cluster, ClusterConfig, ReplicaSpec
    from batchlab.workloads.lengths import Range
    from batchlab.workloads.sessions import SessionShape, make_sessions

    h100, a100 = (ReplicaSpec.for_device("Llama-3-8B", d) for d in ("H100", "A100"))
    requests = make_sessions(SessionShape(num_sessions=num_sessions, turns=1, system_prompt_len=0,
                                          user_len=Range(64, 4096), output_len=Range(16, 1024),
                                          session_rate=session_rate), seed=seed).requests
    p99 = {}
    for policy in ("round_robin", "least_outstanding"):
        cluster = Cluster(ClusterConfig(8, policy), engine_factory=lambda i: (a100 if i < 2 else h100).build(i))
        p99[policy] = per_request_metrics(cluster.run(requests).merged)["ttft"].quantile(0.99)
    return float(p99["round_robin"] / p99["least_outstanding"])


@lru_cache(maxsize=4)
def replicas_needed(session_rate: float = 25.0, num_sessions: int = 750) -> int:
    """12.2: the fewest L4 replicas (of ``SIZING_REPLICAS``) keeping TTFT p90 under ``SLO_P90``."""
    from batchlab.cluster.sweep import cluster_point, grid, run_sweep
    points = grid(policy=["cache_aware"], num_replicas=list(SIZING_REPLICAS), session_rate=[session_rate],
                  num_sessions=[num_sessions], num_system_prompts=[8], system_prompt_len=[1024],
                  kv_capacity_tokens=[None], device=["L4"], seed=[0])
    table = run_sweep(cluster_point, points)
    ok = table.loc[table["ttft_p90"] < SLO_P90, "num_replicas"]
    return int(ok.min()) if len(ok) else -1


@exercise("12.1")
def check_12_1(answer) -> Verdict:
    if answer is None or answer is ...:
        return Verdict("not attempted", "set answer to a number and run the cell again")
    return compare(answer, mixed_fleet_ratio(), rtol=0.02, what="the p99 ratio")


@exercise("12.2")
def check_12_2(answer) -> Verdict:
    if answer is None or answer is ...:
        return Verdict("not attempted", "set answer to an integer and run the cell again")
    return compare(answer, replicas_needed(), what="the number of replicas")
