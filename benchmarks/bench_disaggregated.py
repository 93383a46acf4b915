"""How fast is the disaggregated cluster simulator? The same requests on P + D colocated replicas
and on P prefill + D decode workers, side by side.

    python benchmarks/bench_disaggregated.py                       # 100,000 requests, 2P + 2D
    python benchmarks/bench_disaggregated.py --requests 10000 --prefill 1 --decode 3

The workload: Poisson arrivals of prompts of 500-3,000 tokens with 64-512 output tokens, at
``--rate`` requests per second, on ``ReplicaSpec.for_device(--model, --device)`` replicas (the
GPU preset's roofline, a paged KV cache, continuous batching). The goal, measured in this one run:
the disaggregated run's wall time at most 1.5x the colocated cluster's for the same requests
(``--rounds`` alternated runs, the median of each). Printed: both wall times, their ratio, and
what each served (TTFT and ITL percentiles), for the record, not as a verdict on disaggregation.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from batchlab.analysis.metrics import summary_row
from batchlab.cluster import Cluster, ClusterConfig, DisaggregatedCluster, DisaggregatedConfig, ReplicaSpec
from batchlab.requests import Request


def workload(n: int, rate: float, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1 / rate, n))
    prompts, outputs = rng.integers(500, 3001, n), rng.integers(64, 513, n)
    return [Request(f"r{i}", None, int(o), float(t), prompt_len=int(p))
            for i, (t, p, o) in enumerate(zip(times, prompts, outputs))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--prefill", type=int, default=2)
    p.add_argument("--decode", type=int, default=2)
    p.add_argument("--rate", type=float, default=12.0, help="requests per simulated second")
    p.add_argument("--model", default="Llama-3-8B")
    p.add_argument("--device", default="H100")
    p.add_argument("--link", default="infiniband-ndr")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    reqs = workload(args.requests, args.rate, seed=0)
    spec = ReplicaSpec.for_device(args.model, args.device)
    colocated = Cluster(ClusterConfig(args.prefill + args.decode, policy="least_outstanding"), spec)
    split = DisaggregatedCluster.for_device(args.model, args.device,
                                            DisaggregatedConfig(args.prefill, args.decode, link=args.link))
    walls: dict[str, list[float]] = {"colocated": [], "disaggregated": []}
    rows = {}
    for _ in range(args.rounds):                       # alternated, so drift hits both alike
        for name, cluster in (("colocated", colocated), ("disaggregated", split)):
            start = time.perf_counter()
            merged = cluster.run(reqs).merged
            walls[name].append(time.perf_counter() - start)
            rows[name] = summary_row(merged)
    print(f"{args.requests:,} requests at {args.rate} req/s, {args.model} on {args.device}: "
          f"{args.prefill + args.decode} colocated replicas vs {args.prefill}P + {args.decode}D over {args.link}")
    for name, times in walls.items():
        r = rows[name]
        print(f"  {name:14s} wall {statistics.median(times):6.2f} s (runs {', '.join(f'{t:.2f}' for t in times)}); "
              f"TTFT p50/p99 {r['ttft_p50'] * 1e3:.0f}/{r['ttft_p99'] * 1e3:.0f} ms, "
              f"ITL p50/p99 {r['itl_p50'] * 1e3:.1f}/{r['itl_p99'] * 1e3:.1f} ms")
    ratio = statistics.median(walls["disaggregated"]) / statistics.median(walls["colocated"])
    print(f"  disaggregated / colocated wall time: {ratio:.2f}x (goal: at most 1.5x)")


if __name__ == "__main__":
    main()
