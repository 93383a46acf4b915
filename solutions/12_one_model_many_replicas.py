"""Worked solutions for notebook 12 (one model, many replicas).

Both answers are simulations: the notebook's replicas and workloads with the exercise's numbers.
"""

from batchlab.analysis.metrics import per_request_metrics
from batchlab.cluster import Cluster, ClusterConfig, ReplicaSpec
from batchlab.cluster.sweep import cluster_point, grid, run_sweep
from batchlab.workloads.lengths import Range
from batchlab.workloads.sessions import SessionShape, make_sessions


def solve_12_1() -> tuple[float, float]:
    """The mixed fleet (replicas 0 and 1 on A100s) at 40 requests a second: round robin's p99 over
    least outstanding's for seeds 0-4, and the smallest and largest of the five."""
    h100, a100 = ReplicaSpec.for_device("Llama-3-8B", "H100"), ReplicaSpec.for_device("Llama-3-8B", "A100")
    ratios = []
    for seed in range(5):
        requests = make_sessions(SessionShape(num_sessions=800, turns=1, system_prompt_len=0, user_len=Range(64, 4096),
                                              output_len=Range(16, 1024), session_rate=40.0), seed=seed).requests
        p99 = {}
        for policy in ("round_robin", "least_outstanding"):
            cluster = Cluster(ClusterConfig(8, policy, seed=seed),
                              engine_factory=lambda i: (a100 if i < 2 else h100).build(i))
            p99[policy] = per_request_metrics(cluster.run(requests).merged)["ttft"].quantile(0.99)
        ratios.append(float(p99["round_robin"] / p99["least_outstanding"]))
    return min(ratios), max(ratios)


def solve_12_2() -> int:
    """Sweep the L4 replica count at 25 conversations a second; the first count under the SLO."""
    points = grid(policy=["cache_aware"], num_replicas=list(range(2, 13)), session_rate=[25.0], num_sessions=[750],
                  num_system_prompts=[8], system_prompt_len=[1024], kv_capacity_tokens=[None], device=["L4"],
                  seed=[0])
    table = run_sweep(cluster_point, points)
    return int(table.loc[table["ttft_p90"] < 1.0, "num_replicas"].min())


SOLUTIONS = {"12.1": solve_12_1, "12.2": solve_12_2}
WRONG = {"12.1": 1.78, "12.2": 1}        # 12.1: one seed's ratio, not the range
