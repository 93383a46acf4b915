"""Which step-time formula describes this machine: the additive sum or the roofline? (Prints; asserts nothing.)

    .venv/bin/python benchmarks/bench_cost_models.py [--rounds 1] [--seed 0] [--json out.json]

1. Measure the machine's two roofs with the profiler: memory read bandwidth
   (``measure_bandwidth``) and matmul peak in the model's dtype (``measure_matmul_flops``).
2. Measure real steps of the course's model: the calibration workload's steps (continuous
   batching, token budgets 64 and 512: prompt chunks and decode batches of many sizes) and the
   profiler's sweep (decode batches 1-64, prompt chunks 16-256, decodes at contexts 32-480).
3. Fit both forms on the same steps (``compare_cost_models``: the additive ``CostModel`` by NNLS,
   the roofline's overhead by least relative error) and score them on held-out steps (30%,
   seeded). Prints each form's median and p90 relative error on the held-out steps and which
   wins by how much (the loser's median error over the winner's).
"""

from __future__ import annotations

import argparse
import json
import time

import pandas as pd
import torch

from batchlab.backends import ModelBackend
from batchlab.experiments.calibration import calibration_steps
from batchlab.steptime.cost_model import features_df
from batchlab.steptime.roofline import MODEL_SHAPES, DTYPE_BYTES, RooflineCostModel, compare_cost_models, \
    profile_features
from batchlab.model import load_model
from batchlab.model.llama import LlamaWeights
from batchlab.model.profiler import measure_bandwidth, measure_matmul_flops, profile_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="calibration rounds pooled (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the held-out split")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()

    t0 = time.perf_counter()
    lm = load_model()
    weights = LlamaWeights.from_hf(lm.model)
    dtype = getattr(torch, lm.dtype)
    bandwidth = measure_bandwidth(device=weights.device)
    peak = measure_matmul_flops(dtype=dtype, device=weights.device)
    print(f"{lm.name} on {lm.device} ({lm.dtype}), {torch.get_num_threads()} threads")
    print(f"measured roofs: {bandwidth / 1e9:.1f} GB/s memory read, {peak / 1e9:.1f} GFLOP/s matmul")

    profile = profile_steps(weights, batch_sizes=(1, 2, 4, 8, 16, 32, 64), prefill_sizes=(16, 64, 128, 256),
                            context_lens=(32, 128, 256, 480), bandwidth=bandwidth, repeats=3)
    backend = ModelBackend(lm, num_slots=16, max_seq_len=1024)
    steps = []
    for r in range(args.rounds):
        steps += calibration_steps(backend, seed=r)
    table = pd.concat([features_df(steps).drop(columns="step"), profile_features(profile)], ignore_index=True)
    print(f"measured steps: {len(steps)} calibration + {len(profile)} profiler = {len(table)}")

    roof = RooflineCostModel(MODEL_SHAPES["SmolLM2-135M"], bandwidth, peak, DTYPE_BYTES[lm.dtype],
                             source=f"{lm.name} on {lm.device} ({lm.dtype}), measured roofs")
    result = compare_cost_models(table, roof, seed=args.seed, source=f"{lm.name} on {lm.device} ({lm.dtype})")
    print(f"\nfit on {result['num_train']} steps, scored on {result['num_test']} held-out steps:")
    print(result["errors"].to_string(float_format=lambda v: f"{v:.1%}"))
    print(f"\nadditive: {result['additive']!r}")
    print(f"roofline: {result['roofline']!r}")
    print(f"\nwinner on this machine: {result['winner']}, its median held-out error is "
          f"{result['ratio']:.2f}x smaller than the other's")
    print(f"({time.perf_counter() - t0:.0f} s in all)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bandwidth_Bps": bandwidth, "peak_flops": peak, "winner": result["winner"],
                       "ratio": result["ratio"], "errors": result["errors"].to_dict(orient="index"),
                       "additive": result["additive"].to_dict(), "roofline": result["roofline"].to_dict()},
                      f, indent=2)


if __name__ == "__main__":
    main()
