"""A routing sweep on Ray: every policy at two loads and three seeds, one task per run.

    .venv/bin/python scripts/ray_sweep.py                                   # Ray started in this process
    RAY_ADDRESS=ray://head-node:10001 .venv/bin/python scripts/ray_sweep.py  # on an existing Ray cluster
    ray job submit --address http://head-node:8265 --working-dir . -- python scripts/ray_sweep.py

Prints one row per run (``cluster.sweep.cluster_point``: four simulated L4 replicas of
Llama-3-8B serving chat sessions) and each policy's TTFT p90 over the seeds. A run that fails is
a row with its error; the others go on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchlab.cluster.sweep import cluster_point, grid, run_sweep  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-cpus", type=int, help="CPUs for a Ray started here (default: what Ray detects)")
    parser.add_argument("--in-process", action="store_true", help="run without Ray, one point after another")
    args = parser.parse_args(argv)
    points = grid(policy=["round_robin", "least_outstanding", "cache_aware"], session_rate=[10.0, 40.0],
                  num_sessions=[400], num_replicas=[4], device=["L4"], seed=[0, 1, 2])
    table = run_sweep(cluster_point, points, use_ray=not args.in_process, num_cpus=args.num_cpus)
    print(table.to_string(max_cols=12))
    if "ttft_p90" in table:
        print(table.groupby(["policy", "session_rate"])["ttft_p90"].median().unstack().round(3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
