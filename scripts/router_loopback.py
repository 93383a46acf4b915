"""Start vllm-router on 127.0.0.1 in front of N simulated-device batchlab replicas and measure it.

    .venv/bin/python scripts/router_loopback.py                          # 4 L4 replicas, cache_aware, 3 seeds
    .venv/bin/python scripts/router_loopback.py --replicas 6 --policy power_of_two --simulate H100
    .venv/bin/python scripts/router_loopback.py --serve                  # start them and wait (Ctrl-C stops)

For each seed it sends one session workload through the router and serves the same workload on
the in-process twin (``batchlab.cluster``), then prints TTFT p50 on both sides and the prefix-hit
shares; at the end the router's added TTFT at low load (one request at a time, alternating
straight to a replica and through the router). ``--serve`` prints the router's URL and keeps
everything up until interrupted.
"""

from __future__ import annotations

import argparse
import sys
import time

from batchlab.launch.loopback import VLLM_ROUTER_POLICIES, LoopbackCluster, LoopbackConfig
from batchlab.launch.router_check import (agreement, router_added_latency, serve_in_process,
                                          serve_through_router)
from batchlab.workloads.sessions import SessionShape, ideal_prefix_reuse, make_sessions


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--policy", default="cache_aware", help=f"one of {', '.join(VLLM_ROUTER_POLICIES)}")
    p.add_argument("--simulate", default="L4", help="the replicas' simulated device (see python -m batchlab.serve -h)")
    p.add_argument("--seeds", type=int, default=3, help="workloads sent, one per seed")
    p.add_argument("--sessions", type=int, default=20, help="conversations per workload (two turns each)")
    p.add_argument("--rate", type=float, default=2.0, help="new conversations per second")
    p.add_argument("--serve", action="store_true", help="start everything, print the URL, wait for Ctrl-C")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        config = LoopbackConfig(num_replicas=args.replicas, policy=args.policy, simulate=args.simulate)
    except ValueError as e:
        print(f"router_loopback: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    with LoopbackCluster(config) as lb:
        print(f"vllm-router ({args.policy}) at {lb.url} in front of {lb.replica_urls}; "
              f"started in {time.perf_counter() - t0:.1f} s", flush=True)
        if args.serve:
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                return 0
        shape = SessionShape(num_sessions=args.sessions, turns=2, system_prompt_len=512, num_system_prompts=8,
                             session_rate=args.rate, think_time_s=2.0, user_len=256, output_len=32)
        for seed in range(1, args.seeds + 1):
            requests = make_sessions(shape, seed=seed).requests
            routed, twin = serve_through_router(lb, requests), serve_in_process(config, requests)
            a = agreement(routed, twin)
            print(f"seed {seed}: {len(requests)} requests, ideal reuse {ideal_prefix_reuse(requests):.3f} | router: "
                  f"TTFT p50 {routed['ttft_p50_s'] * 1e3:.1f} ms, hits {routed['prefix_hit_share']:.3f}, "
                  f"errors {routed['num_errors']} | in-process: TTFT p50 {twin['ttft_p50_s'] * 1e3:.1f} ms, "
                  f"hits {twin['prefix_hit_share']:.3f} | TTFT {a['ttft_p50_rel_diff']:+.1%}, "
                  f"hits {a['prefix_hit_points_diff']:+.2f} points", flush=True)
        lat = router_added_latency(lb)
        print(f"router's added TTFT at low load: {lat['router_added_s'] * 1e3:+.2f} ms (direct p50 "
              f"{lat['direct_ttft_p50_s'] * 1e3:.1f} ms, through the router {lat['router_ttft_p50_s'] * 1e3:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
