"""Fit the all-reduce model (batchlab.backends.collectives) to data/gpu_network/ and store it.

    .venv/bin/python scripts/fit_all_reduce.py            # prints each fit, writes collectives.json
    .venv/bin/python scripts/fit_all_reduce.py --check    # prints, and fails if the stored fit differs

Only GPUs within one node are fitted (a tensor-parallel group stays in one node).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchlab.backends.collectives import COLLECTIVES_PATH, fit_all_reduce  # noqa: E402

DATA = ROOT / "data" / "gpu_network"
SOURCE = ("fitted by scripts/fit_all_reduce.py to data/gpu_network/*_all_reduce.csv (Vidur's measured NCCL "
          "all-reduce times, microsoft/vidur data/profiling/network/, MIT License): least squares in "
          "relative error of latency + size * 2 (n - 1) / n / bus_bandwidth over every size, per GPU count")


def fit_all() -> dict:
    nodes = {}
    for path in sorted(DATA.glob("*_all_reduce.csv")):
        table = pd.read_csv(path)
        node = path.name.removesuffix("_all_reduce.csv")
        one_node = table[table["num_workers"] == table["devices_per_node"]]
        nodes[node] = {}
        for n in sorted(one_node["num_workers"].unique()):
            model, stats = fit_all_reduce(one_node, int(n))
            nodes[node][str(int(n))] = {"latency_us": round(model.latency_s * 1e6, 3),
                                        "bus_bandwidth_GBps": round(model.bus_bandwidth_Bps / 1e9, 2),
                                        "rows": stats["rows"], "median_error": round(stats["median_error"], 4),
                                        "worst_error": round(stats["worst_error"], 4)}
    return {"about": "One all-reduce among n GPUs of a node: latency + size * 2 (n - 1) / n / bus_bandwidth.",
            "source": SOURCE, "nodes": nodes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the stored fit differs")
    args = parser.parse_args(argv)
    fits = fit_all()
    for node, by_n in fits["nodes"].items():
        for n, e in by_n.items():
            print(f"{node:>10} x{n}: latency {e['latency_us']:6.1f} us, bus bandwidth {e['bus_bandwidth_GBps']:6.1f} "
                  f"GB/s; {e['rows']} rows, median error {e['median_error']:.1%}, worst {e['worst_error']:.1%}")
    text = json.dumps(fits, indent=1) + "\n"
    if args.check:
        if COLLECTIVES_PATH.read_text(encoding="utf-8") != text:
            print(f"{COLLECTIVES_PATH} differs from the fit: run scripts/fit_all_reduce.py", file=sys.stderr)
            return 1
        return 0
    COLLECTIVES_PATH.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
