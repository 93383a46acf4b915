"""Is bf16 faster than fp32 on this CPU for the course's steps? (Prints; asserts nothing.)

    .venv/bin/python benchmarks/bench_dtypes.py [--repeats 5] [--rounds 2]

Loads the course's model in float32 and in bfloat16 and times, with the profiler, the steps the
course runs most: decode at batch 1, 8 and 32 (context 64) and a 256-token prompt prefill. The
two dtypes are measured alternately, ``--rounds`` times each, and each step's best round is kept,
so drift on a shared machine hits both alike. Prints ms per step in each dtype and the ratio
bf16 / fp32 (below 1: bf16 is faster), with whether this CPU reports bf16 matrix units (AMX or
AVX512-BF16 in /proc/cpuinfo), then the dtype probe's timings and verdict beside the steps' own
(``dtype="auto"`` trusts the probe: both should pick the same dtype).
"""

from __future__ import annotations

import argparse

import pandas as pd

from batchlab.model import load_model
from batchlab.model.cpu_dtype import cpu_bf16_flags, probe_cpu_dtypes
from batchlab.model.llama import LlamaWeights
from batchlab.model.profiler import profile_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    models = {dtype: LlamaWeights.from_hf(load_model(device="cpu", dtype=dtype).model)
              for dtype in ("float32", "bfloat16")}
    best: dict[str, pd.DataFrame] = {}
    for _ in range(args.rounds):
        for dtype, weights in models.items():
            df = profile_steps(weights, batch_sizes=(1, 8, 32), context_len=64, prefill_sizes=(256,),
                               repeats=args.repeats)
            key = df["kind"] + " " + df["num_tokens"].astype(str)
            ms = pd.Series(df["ms_per_step"].to_numpy(), index=key)
            best[dtype] = ms if dtype not in best else pd.concat([best[dtype], ms], axis=1).min(axis=1)
    table = pd.DataFrame({"fp32 ms": best["float32"], "bf16 ms": best["bfloat16"]})
    table["bf16/fp32"] = table["bf16 ms"] / table["fp32 ms"]
    table.index = [i.replace("decode ", "decode batch ").replace("prefill ", "prefill tokens ") for i in table.index]
    print(f"CPU bf16 flags: {cpu_bf16_flags() or 'none'}")
    print(table.to_string(float_format=lambda v: f"{v:.2f}"))
    prefill = table.loc["prefill tokens 256"]
    print(f"prefill: {256 / prefill['fp32 ms'] * 1e3:.0f} tokens/s fp32, {256 / prefill['bf16 ms'] * 1e3:.0f} bf16")
    # The probe that dtype="auto" trusts, beside the steps it stands for: do they pick the same?
    probe = probe_cpu_dtypes()
    print("dtype probe (ms of one step's products):",
          {dtype: {rows: round(1e3 * s, 2) for rows, s in times.items()} for dtype, times in probe["seconds"].items()})
    steps_pick = "bfloat16" if (table["bf16/fp32"] < 1).all() else "float32"
    probe_pick = "bfloat16" if probe["bf16_faster"] else "float32"
    print(f"faster at every step measured here: {steps_pick}; the probe picks {probe_pick}"
          + ("" if steps_pick == probe_pick else " (they disagree: the probe misjudges this CPU)"))


if __name__ == "__main__":
    main()
