"""Profile this device and save what the course needs to plot and simulate it.

    .venv/bin/python scripts/profile_device.py [--max-batch 256] [--out data/device_profiles]

Measures the two roofs (memory read bandwidth, matmul peak in the model's dtype), the profiler's
step sweep (decode batches 1, 2, 4, ... up to ``--max-batch``; prompt chunks; decodes at several
contexts), the calibration workload's steps, and fits both cost forms on them (the additive
``CostModel`` and the ``RooflineCostModel``'s overhead, scored on held-out steps). Writes
``<out>/<device>.json``, with ``<device>`` the device's name in lower case, words joined by ``-``
(e.g. ``nvidia-h200``). ``scripts/gpu_check.sh`` runs this on a lent GPU; it runs on a CPU too
(use small sizes there: ``--max-batch 8 --prefill 16 64 --contexts 64``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

import pandas as pd
import torch

from batchlab.backends import ModelBackend
from batchlab.experiments.calibration import calibration_steps
from batchlab.steptime.cost_model import features_df
from batchlab.steptime.roofline import DTYPE_BYTES, MODEL_SHAPES, RooflineCostModel, compare_cost_models, \
    profile_features
from batchlab.model import load_model
from batchlab.model.environment import device_name, device_slug, environment_report
from batchlab.model.llama import LlamaWeights
from batchlab.model.profiler import measure_bandwidth, measure_matmul_flops, profile_steps



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-batch", type=int, default=256, help="largest decode batch (default 256)")
    parser.add_argument("--prefill", type=int, nargs="+", default=[16, 64, 256, 512, 1024])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 1024])  # scratch KV: 256 x 1025 slots, 6 GB in bf16
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="data/device_profiles")
    args = parser.parse_args()
    if args.max_batch < 1:
        parser.error(f"--max-batch={args.max_batch}; must be >= 1")

    t0 = time.perf_counter()
    lm = load_model()
    weights = LlamaWeights.from_hf(lm.model)
    name = device_name(lm.device)
    dtype = getattr(torch, lm.dtype)
    bandwidth = measure_bandwidth(device=weights.device)
    peak = measure_matmul_flops(size=4096 if lm.device != "cpu" else 1024, dtype=dtype, device=weights.device)
    print(f"{name} ({lm.device}, {lm.dtype}): {bandwidth / 1e9:.1f} GB/s, {peak / 1e12:.2f} TFLOP/s")

    batches = [1 << i for i in range(args.max_batch.bit_length()) if 1 << i <= args.max_batch]
    profile = profile_steps(weights, batch_sizes=batches, prefill_sizes=args.prefill,
                            context_lens=args.contexts, context_batch=min(32, args.max_batch),
                            repeats=args.repeats, bandwidth=bandwidth)
    print(profile[["kind", "batch_size", "num_tokens", "context_len", "ms_per_step", "x_floor"]]
          .to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    backend = ModelBackend(lm, num_slots=16, max_seq_len=1024)
    steps = calibration_steps(backend)
    table = pd.concat([features_df(steps).drop(columns="step"), profile_features(profile)], ignore_index=True)
    roof = RooflineCostModel(MODEL_SHAPES["SmolLM2-135M"], bandwidth, peak, DTYPE_BYTES[lm.dtype],
                             source=f"{lm.name} on {name} ({lm.dtype}), measured roofs")
    result = compare_cost_models(table, roof, source=f"{lm.name} on {name} ({lm.dtype})")
    print(result["errors"].to_string(float_format=lambda v: f"{v:.1%}"))
    print(f"winner: {result['winner']} ({result['ratio']:.2f}x smaller median held-out error)")

    record = {
        "device": name, "device_type": lm.device, "dtype": lm.dtype, "model": lm.name,
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment_report(lm.device),
        "bandwidth_Bps": bandwidth, "peak_flops": peak,
        "profile": profile.to_dict(orient="records"),
        "cost_models": {"additive": result["additive"].to_dict(), "roofline": result["roofline"].to_dict()},
        "held_out_errors": result["errors"].to_dict(orient="index"),
        "winner": result["winner"], "num_calibration_steps": len(steps),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{device_slug(name)}.json"
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"saved {path} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
