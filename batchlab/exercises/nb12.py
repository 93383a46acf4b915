"""Checkers for notebook 12 (one model, many replicas).

Each checker runs the simulation the exercise describes (the same seeded workload and replicas,
so the expected answer is exact) and compares, once per session (cached). They take about ten
seconds (12.1) to half a minute (12.2), and run only once an answer is given.
"""

from __future__ import annotations

from functools import lru_cache

from batchlab.exercises import Verdict, compare, exercise

SLO_P90 = 1.0
SIZING_REPLICAS = tuple(range(2, 13))
RATIO_SEEDS = (0, 1, 2, 3, 4)


@lru_cache(maxsize=4)
def mixed_fleet_ratio(session_rate: float = 40.0, num_sessions: int = 800, seed: int = 0) -> float:
    """Round robin's TTFT p99 / least outstanding's on the notebook's mixed fleet, for one seed
    (of the traffic and of the router)."""
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
        cluster = Cluster(ClusterConfig(8, policy, seed=seed),
                          engine_factory=lambda i: (a100 if i < 2 else h100).build(i))
        p99[policy] = per_request_metrics(cluster.run(requests).merged)["ttft"].quantile(0.99)
    return float(p99["round_robin"] / p99["least_outstanding"])


@lru_cache(maxsize=4)
def replicas_needed(session_rate: float = 25.0, num_sessions: int = 750) -> int:
    """12.2: the fewest L4 replicas (of ``SIZING_REPLICAS``) keeping TTFT p90 under ``SLO_P90``."""
    from batchlab.cluster.sweep import cluster_point, grid, run_sweep
    points = grid(policy=["cache_aware"], num_replicas=list(SIZING_REPLICAS),
                  session_rate=[session_rate],
                  num_sessions=[num_sessions], num_system_prompts=[8], system_prompt_len=[1024],
                  kv_capacity_tokens=[None], device=["L4"], seed=[0])
    table = run_sweep(cluster_point, points)
    ok = table.loc[table["ttft_p90"] < SLO_P90, "num_replicas"]
    return int(ok.min()) if len(ok) else -1


def ratio_range() -> tuple[float, float]:
    """12.1: the smallest and largest p99 ratio over ``RATIO_SEEDS``."""
    ratios = [mixed_fleet_ratio(seed=seed) for seed in RATIO_SEEDS]
    return min(ratios), max(ratios)


@exercise("12.1")
def check_12_1(answer) -> Verdict:
    if answer is None or answer is ...:
        return Verdict("not attempted", "set answer to (smallest, largest) and run the cell again")
    # The simulation is seeded, so each seed's ratio is exact; 2% only absorbs rounding.
    verdict = compare(answer, ratio_range(), rtol=0.02,
                      what="(smallest, largest) p99 ratio over seeds 0-4")
    if verdict.ok:
        low, high = ratio_range()
        return Verdict(verdict.status,
                       f"{verdict.message}: from {low:.2f} to {high:.2f}. At 40 a second the "
                       "seeds differ by as much as the effect itself, so one run's ratio could "
                       "not have told you how much round robin costs")
    return verdict


@exercise("12.2")
def check_12_2(answer) -> Verdict:
    if answer is None or answer is ...:
        return Verdict("not attempted", "set answer to an integer and run the cell again")
    return compare(answer, replicas_needed(), what="the number of replicas")
