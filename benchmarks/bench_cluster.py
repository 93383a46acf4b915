"""How fast is the cluster simulator? 100,000 chat requests over 16 replicas against one engine.

    python benchmarks/bench_cluster.py                               # 100k requests, 16 replicas
    python benchmarks/bench_cluster.py --requests 10000 --policy power_of_two
    python benchmarks/bench_cluster.py --device A100 --load 0.6

The workload: multi-turn chat sessions (``workloads.sessions``) over a few shared system
prompts, so prefix caching hits. Every replica is ``ReplicaSpec.for_device(--model, --device)``:
the roofline cost model of the GPU preset, a paged KV cache (16-token blocks) with prefix
caching, as many KV tokens as fit in 90% of the device's memory after the weights, and
continuous batching (``--max-num-seqs``, 2,048 tokens per step).

The load: one replica's capacity is measured first (requests per simulated second when a burst
of the same kind of requests waits from the start). The cluster is offered ``--load`` times
``--replicas`` times that capacity.

The goal, measured side by side in this one run: the cluster's wall time is at most 1.5x the
wall time of ONE engine serving the same requests at the same per-replica load. "The same
per-replica load" means the same requests (same ids, prompts, lengths) with every arrival time
multiplied by ``--replicas``: one engine then receives requests at 1/``--replicas`` of the
cluster's rate, what each replica of the cluster receives on average, and it simulates the same
number of requests (equivalently, ``--replicas`` engines each serving 1/``--replicas`` of them,
one after another). Both runs use the simulator's fast path, and the time to build the workload
is not counted. Printed: both wall times, their ratio, requests simulated per second.
"""

from __future__ import annotations

import argparse
import time

from batchlab.analysis.metrics import summary_row
from batchlab.cluster import Cluster, ClusterConfig, ReplicaSpec
from batchlab.workloads import Range, SessionShape, ideal_prefix_reuse, make_sessions, scale_arrivals


def session_shape(num_sessions: int) -> SessionShape:
    """Chat sessions: 1-5 turns, 8 system prompts of 512 tokens, short messages, 32-256 token answers."""
    return SessionShape(num_sessions, turns=Range(1, 5), system_prompt_len=512, num_system_prompts=8,
                        user_len=Range(16, 128), output_len=Range(32, 256), think_time_s=10.0)


def workload(num_requests: int, rate: float, seed: int):
    """About ``num_requests`` session requests (whole sessions), arriving at ``rate`` requests/s."""
    sessions = make_sessions(session_shape(max(1, round(num_requests / 3))), seed=seed)
    requests = sessions.requests[:num_requests]
    factor = (len(requests) / rate) / max(requests[-1].arrival_time, 1e-9)
    return scale_arrivals(requests, factor), sessions.session_of


def replica_capacity(spec: ReplicaSpec, seed: int, num_requests: int = 2000) -> float:
    """Requests per simulated second one replica sustains when a burst waits from the start."""
    burst = scale_arrivals(make_sessions(session_shape(num_requests // 3), seed=seed + 1).requests, 0.0)
    trace = spec.build(0).run(burst)
    return len(burst) / max(r.release_time for r in trace.requests)


def timed(fn):
    t0, cpu0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - cpu0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--policy", default="cache_aware")
    parser.add_argument("--model", default="Llama-3-8B")
    parser.add_argument("--device", default="H100")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--load", type=float, default=0.8, help="offered load per replica / its capacity")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    spec = ReplicaSpec.for_device(args.model, args.device, max_num_seqs=args.max_num_seqs)
    capacity = replica_capacity(spec, args.seed)
    rate = args.load * capacity * args.replicas
    print(f"replica: {args.model} on {args.device}, {spec.kv_capacity_tokens:,} KV tokens, "
          f"max_num_seqs={args.max_num_seqs}; capacity {capacity:.1f} req/s (simulated)")
    (requests, session_of), made, _ = timed(lambda: workload(args.requests, rate, args.seed))
    print(f"workload: {len(requests):,} session requests at {rate:.1f} req/s ({args.load:.0%} of "
          f"{args.replicas} replicas' capacity); ideal prefix reuse {ideal_prefix_reuse(requests):.0%} "
          f"(made in {made:.1f} s)")

    cluster = Cluster(ClusterConfig(args.replicas, args.policy, seed=args.seed), spec)
    result, wall_cluster, cpu_cluster = timed(lambda: cluster.run(requests, session_of))
    alone = scale_arrivals(requests, float(args.replicas))
    trace, wall_one, cpu_one = timed(lambda: spec.build(0).run(alone))

    for name, tr, wall, cpu in (("cluster", result.merged, wall_cluster, cpu_cluster),
                                ("one engine", trace, wall_one, cpu_one)):
        row = summary_row(tr)
        print(f"{name:>10}: wall {wall:6.2f} s (CPU {cpu:6.2f} s)  {len(requests) / wall:8,.0f} requests/s  "
              f"simulated {tr.duration:8.1f} s  TTFT p50 {row['ttft_p50'] * 1e3:7.1f} ms  "
              f"finished {int(row['num_finished']):,}")
    hits = result.hit_summary()
    print(f"cluster ({args.policy}): prefix hits predicted {hits['predicted_hit_share']:.1%}, cached at "
          f"routing {hits['cached_at_route_share']:.1%}, reused at admission {hits['admitted_hit_share']:.1%}")
    steps = sum(len(t.steps) for t in result.traces)
    fast = sum(t.meta["num_fast_steps"] for t in result.traces)
    print(f"steps: cluster {steps:,} ({fast / max(steps, 1):.0%} fast path), one engine {len(trace.steps):,} "
          f"({trace.meta['num_fast_steps'] / max(len(trace.steps), 1):.0%} fast path)")
    ratio = wall_cluster / wall_one
    print(f"cluster / one engine wall time: {ratio:.2f}x  (goal <= 1.5x: {'met' if ratio <= 1.5 else 'missed'})")


if __name__ == "__main__":
    main()
