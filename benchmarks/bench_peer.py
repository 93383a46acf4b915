"""The project's speed goals for the peer benchmark, checked on a run of ``python -m benchmarks.peer``.

``benchmarks.peer`` measures and prints; what counts as good enough is the project's business, so
the targets live here, not in the library. Arguments are passed on to the benchmark:

    .venv/bin/python benchmarks/bench_peer.py --dtype both      # offline, every contender, both dtypes
    .venv/bin/python benchmarks/bench_peer.py --threads 1       # on a machine shared with other jobs

Every goal is a ratio measured side by side in the same run (never an absolute time):

- against vLLM's CPU build in its best configuration in this run (eager or compiled, in the
  dtype where it was faster): batchlab's continuous batching at >= 1.0x vLLM's throughput, with
  a TTFT p50 no worse than vLLM's;
- in that same dtype, >= 2x transformers' continuous batching;
- in fp32, >= 50% of the ceiling the benchmark prints for fp32 (from the measured bandwidth and
  matmul peak; the bf16 ceiling rests on a 2048-square matmul peak that products of 1-32 rows
  do not approach, so its fraction is printed, not judged), and the earlier goals against
  transformers' continuous batching.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the checkout: ``benchmarks`` is a folder there
from benchmarks import peer as bench                               # noqa: E402

# (contender, figure in its summary, comparison, target).
VLLM_GOALS = (
    ("batchlab_continuous", "throughput_vs_vllm", ">=", 1.0),
    ("batchlab_continuous", "ttft_p50_vs_vllm", "<=", 1.0),
    ("batchlab_continuous", "throughput_vs_hf_continuous", ">=", 2.0),
)
# In fp32: the share of the ceiling, and ratios against transformers' continuous batching (the
# benchmark's reference contender).
FP32_GOALS = (
    ("batchlab_continuous", "fraction_of_bound", ">=", 0.5),
    ("batchlab_continuous", "throughput_vs_hf_continuous", ">=", 4.0),
    ("batchlab_continuous", "ttft_p50_vs_hf_continuous", "<=", 1 / 3),
)


def best_vllm(run: dict) -> dict | None:
    """vLLM's best configuration (eager or compiled) in one dtype's run, as the ratios use it."""
    name = run.get("vllm_reference")
    return None if name is None else {"name": name, **run["contenders"][name]}


def vllm_faster_dtype(results: dict) -> str | None:
    """The dtype in which vLLM's best throughput was highest in this run (None: vLLM did not run)."""
    measured = {d: best_vllm(run)["throughput_tok_s"] for d, run in results["runs"].items() if best_vllm(run)}
    return max(measured, key=measured.get) if measured else None


def _check(run: dict, goals, dtype: str) -> list[str]:
    lines = []
    for contender, figure, op, target in goals:
        summary = run["contenders"].get(contender)
        value = None if summary is None else summary.get(figure)
        if value is None:
            lines.append(f"[{dtype}] {contender} {figure}: not measured in this run (target {op} {target:.2f})")
            continue
        met = value >= target if op == ">=" else value <= target
        lines.append(f"[{dtype}] {contender} {figure} = {value:.2f} (target {op} {target:.2f}): "
                     f"{'PASS' if met else 'MISS'}")
    return lines


def goal_report(results: dict) -> list[str]:
    """One line per goal: the measured ratio, the target, PASS or MISS (offline runs only)."""
    runs = results["runs"]
    if any(run["config"]["mode"] != "offline" for run in runs.values()):
        return ["goals are set for the offline workload; run without --mode online"]
    lines = []
    dtype = vllm_faster_dtype(results)
    if dtype is None:
        lines.append("vLLM did not run, so its goals are not measured: "
                     + "; ".join(run.get("skipped", {}).get("vllm") or run.get("errors", {}).get("vllm")
                                 or "not selected" for run in runs.values()))
    else:
        best = best_vllm(runs[dtype])
        others = [d for d in runs if d != dtype and best_vllm(runs[d])]
        lines.append(f"vLLM's best configuration in this run: {best['name']} in {dtype}"
                     + "".join(f" ({best['throughput_tok_s']:.1f} against {best_vllm(runs[d])['throughput_tok_s']:.1f}"
                               f" tok/s, {best_vllm(runs[d])['name']}, in {d})" for d in others))
        lines += _check(runs[dtype], VLLM_GOALS, dtype)
    if "float32" in runs:
        lines += _check(runs["float32"], FP32_GOALS, "float32")
    return lines


if __name__ == "__main__":
    results = bench.main(sys.argv[1:])
    print("\n".join(["goals:"] + goal_report(results)))
