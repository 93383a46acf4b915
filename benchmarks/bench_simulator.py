"""How fast is the simulator? Serve 100,000 chat-like requests near saturation and time it.

    python benchmarks/bench_simulator.py                         # 100k requests, max_num_seqs=16
    python benchmarks/bench_simulator.py --max-num-seqs 64 --requests 20000
    python benchmarks/bench_simulator.py --cost-model data/cost_model_cpu.json --slow
    python benchmarks/bench_simulator.py --table                 # slots vs paged at 16 and 256 seqs

``--cache paged`` serves on a paged cache (``--block-size`` tokens a block, prefix caching on)
instead of reserving slots; ``--table`` runs both caches at 16 and 256 sequences, alternating,
and prints requests simulated per second for each (best of 3) and the median paged/slot wall-time
ratio of the three back-to-back pairs, then the
same number of requests through ``bench_cluster.py``'s 16-replica cluster.

The workload: prompts of 100-300 tokens, answers of 100-200 tokens (uniform), Poisson arrivals
at ``--load`` times the server's capacity. The capacity is measured first, by serving a short
burst of the same kind of requests all at once (the server is then never idle) and dividing
requests by simulated seconds. Policy: ``ContinuousBatcher`` on a ``SimBackend``.

The cost model is ``--cost-model`` (a JSON saved by ``CostModel.save``, e.g. a fit of the real
model) or, by default, the illustrative coefficients below: CPU-like magnitudes written here by
hand, not a measurement. The simulator's speed depends on them only through how many
sequences share a step.

What costs time: every step is a Python object in the trace, and every step in which a request
joins or leaves asks the scheduler for a full plan (one chunk per running sequence). Steps in
between are computed by the offline driver's fast path (``batchlab/sim/fast_path.py``), on both caches
(a paged run stops short of each step that needs more blocks than are free). So wall time grows
with the number of steps (smaller batches: more steps) and with ``max_num_seqs`` times the
number of requests (each join rebuilds a plan of the whole batch).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from batchlab.backends import CostModel
from batchlab.sim import SimBackend
from batchlab.engine import Engine
from batchlab.schedulers import ContinuousBatcher
from batchlab.workloads import Range, make_workload

# Illustrative, hand-written (not measured): 20 ms per step, 0.2 ms per sequence, 3 ms per token,
# 0.2 µs per attention pair.
ILLUSTRATIVE = CostModel(fixed_s=0.020, per_seq_s=0.0002, per_token_s=0.003, per_attention_pair_s=2e-7,
                         source="illustrative coefficients written in benchmarks/bench_simulator.py")
PROMPT_LEN = Range(100, 300)
OUTPUT_LEN = Range(100, 200)


def make_engine(cost: CostModel, args: argparse.Namespace, fast: bool) -> Engine:
    scheduler = ContinuousBatcher(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens)
    paged = {"block_size": args.block_size, "enable_prefix_caching": True} if args.cache == "paged" else {}
    backend = SimBackend(cost, kv_capacity_tokens=args.kv_capacity_tokens, noise=args.noise, seed=args.seed,
                         **paged)
    return Engine(scheduler, backend, fast_decode_runs=fast)


def measure_capacity(cost: CostModel, args: argparse.Namespace, num_requests: int = 2000) -> float:
    """Requests per simulated second when requests are always waiting (a burst at t = 0)."""
    burst = make_workload(num_requests, prompt_len=PROMPT_LEN, output_len=OUTPUT_LEN, arrival="at_once",
                          seed=args.seed + 1)
    trace = make_engine(cost, args, fast=True).run(burst)
    last_release = max(r.release_time for r in trace.requests)
    return num_requests / last_release


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--kv-capacity-tokens", type=int, default=1_000_000)
    parser.add_argument("--cache", choices=("slot", "paged"), default="slot",
                        help="reserving slots, or paged blocks with prefix caching")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--load", type=float, default=0.9, help="arrival rate / measured capacity")
    parser.add_argument("--noise", type=float, default=0.0, help="lognormal sigma of step times")
    parser.add_argument("--cost-model", type=Path, default=None, help="a saved CostModel JSON")
    parser.add_argument("--slow", action="store_true", help="turn the fast path off")
    parser.add_argument("--table", action="store_true",
                        help="slot and paged caches at 16 and 256 sequences, side by side")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def run_once(cost: CostModel, args: argparse.Namespace, verbose: bool = True) -> tuple[float, float]:
    """Serve ``args.requests`` Poisson arrivals at ``args.load`` of capacity; (wall s, CPU s)."""
    capacity = measure_capacity(cost, args)
    rate = args.load * capacity
    requests = make_workload(args.requests, prompt_len=PROMPT_LEN, output_len=OUTPUT_LEN, arrival="poisson",
                             rate=rate, seed=args.seed)
    engine = make_engine(cost, args, fast=not args.slow)
    t0, cpu0 = time.perf_counter(), time.process_time()
    trace = engine.run(requests)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if verbose:
        tokens = sum(r.num_output_tokens for r in trace.requests)
        steps = len(trace.steps)
        fast = trace.meta["num_fast_steps"]
        print(f"{args.cache} cache, max_num_seqs={args.max_num_seqs}: capacity {capacity:.3f} req/s "
              f"(simulated), arrivals at {rate:.3f} req/s ({args.load:.0%})")
        print(f"  simulated {trace.duration / 3600:.1f} h of serving, {steps:,} steps ({fast / max(steps, 1):.0%} "
              f"on the fast path), {tokens:,} tokens, {trace.meta['num_preemptions']} preemptions")
        print(f"  wall {wall:.2f} s -> {args.requests / wall:,.0f} requests/s (CPU {cpu:.2f} s)")
    return wall, cpu


def table(cost: CostModel, args: argparse.Namespace, rounds: int = 3) -> None:
    """Both caches at 16 and 256 sequences, alternating, ``rounds`` times: the best wall time of
    each, and the median of each round's paged/slot ratio (a pair run back to back shares the
    machine's speed of the moment; these VMs drift 10-30% within minutes)."""
    best: dict[tuple[int, str], float] = {}
    ratios: dict[int, list[float]] = {16: [], 256: []}
    for r in range(rounds):
        for seqs in (16, 256):
            wall = {}
            for cache in ("slot", "paged") if r % 2 == 0 else ("paged", "slot"):
                args.max_num_seqs, args.cache = seqs, cache
                wall[cache], _ = run_once(cost, args, verbose=False)
                best[seqs, cache] = min(wall[cache], best.get((seqs, cache), float("inf")))
            ratios[seqs].append(wall["paged"] / wall["slot"])
    print(f"{args.requests:,} requests, {rounds} alternating rounds:")
    print(f"{'max_num_seqs':>12} {'slot req/s':>12} {'paged req/s':>12} {'paged/slot wall (median, range)':>32}")
    for seqs in (16, 256):
        slot, paged, rs = best[seqs, "slot"], best[seqs, "paged"], sorted(ratios[seqs])
        print(f"{seqs:>12} {args.requests / slot:>12,.0f} {args.requests / paged:>12,.0f} "
              f"{statistics.median(rs):>14.2f}x ({rs[0]:.2f}-{rs[-1]:.2f})")
    num_replicas, wall = cluster_run(args)
    print(f"{num_replicas} replicas (benchmarks/bench_cluster.py's run: chat sessions, cache-aware routing, "
          f"Llama-3-8B on the H100 preset, paged blocks with prefix caching, 80% load): "
          f"{args.requests / wall:,.0f} requests/s ({wall:.1f} s)")


def cluster_run(args: argparse.Namespace, num_replicas: int = 16) -> tuple[int, float]:
    """The many-replicas benchmark's cluster run (``bench_cluster.py``'s defaults); its wall seconds."""
    import bench_cluster     # (beside this script)
    from batchlab.cluster import Cluster, ClusterConfig, ReplicaSpec

    spec = ReplicaSpec.for_device("Llama-3-8B", "H100", max_num_seqs=256)
    rate = 0.8 * bench_cluster.replica_capacity(spec, args.seed) * num_replicas
    requests, session_of = bench_cluster.workload(args.requests, rate, args.seed)
    cluster = Cluster(ClusterConfig(num_replicas, "cache_aware", seed=args.seed), spec)
    t0 = time.perf_counter()
    cluster.run(requests, session_of)
    return num_replicas, time.perf_counter() - t0


def main() -> None:
    args = parse_args()
    cost = CostModel.load(args.cost_model) if args.cost_model else ILLUSTRATIVE
    print(f"cost model: {cost!r}\n  source: {cost.source or '(none given)'}")
    if args.table:
        table(cost, args)
    else:
        run_once(cost, args)


if __name__ == "__main__":
    main()
