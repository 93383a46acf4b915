"""The project's speed goals for the peer benchmark, checked on a run of ``python -m batchlab.bench``.

``batchlab.bench`` measures and prints; what counts as good enough is the project's business, so
the targets live here, not in the library. Arguments are passed on to the benchmark:

    .venv/bin/python scripts/bench_peer.py                 # offline, every contender
    .venv/bin/python scripts/bench_peer.py --threads 1     # on a machine shared with other jobs
"""

from __future__ import annotations

import sys

from batchlab import bench

# (contender, figure in its summary, comparison, target). Ratios are against transformers'
# continuous batching measured in the same run (the benchmark's reference contender).
GOALS = (
    ("batchlab_continuous", "throughput_vs_hf_continuous", ">=", 4.0),
    ("batchlab_continuous", "ttft_p50_vs_hf_continuous", "<=", 1 / 3),
)


def goal_report(results: dict) -> list[str]:
    """One line per goal: the measured figure, the target, met or missed (offline runs only)."""
    if results["config"]["mode"] != "offline":
        return ["goals are set for the offline workload; run without --mode online"]
    lines = []
    for contender, figure, op, target in GOALS:
        summary = results["contenders"].get(contender)
        value = None if summary is None else summary.get(figure)
        if value is None:
            lines.append(f"{contender} {figure}: not measured in this run (target {op} {target:.2f})")
            continue
        met = value >= target if op == ">=" else value <= target
        lines.append(f"{contender} {figure} = {value:.2f} (target {op} {target:.2f}): "
                     f"{'met' if met else 'missed'}")
    return lines


if __name__ == "__main__":
    results = bench.main(sys.argv[1:])
    print("\n".join(["goals:"] + goal_report(results)))
