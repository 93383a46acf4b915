"""Fit the all-reduce model (batchlab.steptime.collectives) to data/gpu_network/ and store it.

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

from batchlab.steptime.collectives import COLLECTIVES_PATH, fit_all_reduce  # noqa: E402

DATA = ROOT / "data" / "gpu_network"
SOURCE = ("fitted by scripts/fit_all_reduce.py to data/gpu_network/*_all_reduce.csv (Vidur's measured NCCL "
          "all-reduce times, microsoft/vidur data/profiling/network/, MIT License): least squares in "
          "relative error of latency + size * 2 (n - 1) / n / bus_bandwidth over every size, per GPU count")


# vLLM's own all-reduce for small messages (vllm/distributed/device_communicators/custom_all_reduce.py,
# used under 8 MiB within an NVLink node): its time per call on H100s, as published in
# sgl-project/sglang PR #2904 (2025-01-15, "vllm" table: float32 elements, time per call over 5,000
# back-to-back calls, no CUDA graph).
CUSTOM_SOURCE = ("vLLM's custom all-reduce (vllm/distributed/device_communicators/custom_all_reduce.py: used for "
                 "messages under 8 MiB within an NVLink node) on H100s, time per call over 5,000 back-to-back calls "
                 "without CUDA graphs, as published in sgl-project/sglang PR #2904 (2025-01-15); sizes there are "
                 "float32 elements (sgl-kernel/tests/test_trt_reduce.py at that time), here bytes")
CUSTOM_ELEMENTS = (512, 4096, 32768, 262144, 524288, 1048576)
CUSTOM_MS = {2: (0.0095, 0.0088, 0.0087, 0.0129, 0.0177, 0.0266),
             4: (0.0091, 0.0085, 0.0092, 0.0206, 0.0269, 0.0402),
             8: (0.0101, 0.0093, 0.0118, 0.0241, 0.0304, 0.0450)}


def custom_table() -> dict:
    return {"source": CUSTOM_SOURCE, "max_bytes": 8 * 2**20, "bytes": [4 * e for e in CUSTOM_ELEMENTS],
            "us": {str(n): [round(ms * 1e3, 2) for ms in times] for n, times in CUSTOM_MS.items()}}


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
    return {"about": "One all-reduce among n GPUs of a node: NCCL's, latency + size * 2 (n - 1) / n / bus_bandwidth "
                     "('nodes'); under custom.max_bytes on an H100 node, vLLM's custom all-reduce as measured "
                     "('custom': piecewise linear in bytes).",
            "source": SOURCE, "nodes": nodes, "custom": {"h100_dgx": custom_table()}}


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
