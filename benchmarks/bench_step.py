"""Benchmark of the batched step, measured side by side in one run (prints numbers; asserts nothing).

    .venv/bin/python benchmarks/bench_step.py [--context 64] [--repeats 7]

Prints: the measured memory bandwidth and the weight-read floor of a decode step; the measured
peak matmul throughput and the compute ceilings it sets (prefill tokens/s at best, the shortest a
batch-32 decode step can be); batchlab's
decode step at batch 1, 8, 32 (ms, × floor, ratio to batch 1); transformers' own forward for a
batch-1 decode step with its KV cache (the same weights); prefill throughput. The targets from
the project's issue on these 2-core CPUs: batch-1 ≤ 1.5× floor, batch-32 ≤ 2.5× batch-1,
prefill ≥ 1,000 tokens/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from batchlab.model import load_model
from batchlab.model.llama import LlamaWeights
from batchlab.model.profiler import measure_bandwidth, measure_matmul_flops, profile_steps


def transformers_decode_ms(lm, context: int, repeats: int) -> float:
    """Median ms of one batch-1 decode step through transformers' forward with its own cache."""
    model = lm.model
    ids = torch.randint(0, model.config.vocab_size, (1, context))
    times = []
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        cache, token = out.past_key_values, torch.tensor([[5]])
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            out = model(token, past_key_values=cache, use_cache=True)
            if i:  # the first call warms up
                times.append(time.perf_counter() - t0)
            cache = out.past_key_values
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=64, help="cached tokens per sequence in decode steps")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch-sizes", default="1,8,32", help="comma-separated decode batch sizes")
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    args = parser.parse_args()

    lm = load_model()
    weights = LlamaWeights.from_hf(lm.model)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    bandwidth = measure_bandwidth(device=weights.device)
    peak_flops = measure_matmul_flops(dtype=weights.dtype, device=weights.device)
    hf_ms = transformers_decode_ms(lm, args.context, args.repeats)
    df = profile_steps(weights, batch_sizes=batches, context_len=args.context,
                       prefill_sizes=(128, 512), repeats=args.repeats, bandwidth=bandwidth)
    hf_ms_after = transformers_decode_ms(lm, args.context, args.repeats)  # bracket ours: noise check
    floor = df["floor_ms"].iloc[0]
    decode = df[df.kind == "decode"].set_index("batch_size")
    prefill = df[df.kind == "prefill"].set_index("num_tokens")
    b1 = decode.loc[batches[0], "ms_per_step"]

    print(f"device {lm.device} ({lm.dtype}), {torch.get_num_threads()} threads, context {args.context}")
    print(f"memory bandwidth {bandwidth / 1e9:.1f} GB/s; weights read per step "
          f"{weights.num_bytes() / 1e6:.0f} MB → floor {floor:.1f} ms")
    print(f"transformers forward, batch 1: {hf_ms:.1f} ms before, {hf_ms_after:.1f} ms after "
          f"({min(hf_ms, hf_ms_after) / floor:.2f}× floor)")
    # Every token multiplies its row by every projection once (2 FLOPs per weight); a token that
    # needs a next token also goes through the LM head. Attention's FLOPs come on top.
    proj = sum(w.numel() for lw in weights.layers for w in (lw.w_qkv, lw.w_o, lw.w_gate_up, lw.w_down))
    flops_token, flops_head = 2 * proj, 2 * weights.lm_head.numel()
    print(f"peak matmul {peak_flops / 1e9:.0f} GFLOP/s ({str(weights.dtype).removeprefix('torch.')}); "
          f"{flops_token / 1e6:.0f} MFLOP per token in the projections, {flops_head / 1e6:.0f} in the LM head")
    print(f"  compute ceilings: prefill ≤ {peak_flops / flops_token:.0f} tokens/s before attention; "
          f"a batch-32 decode step ≥ {32 * (flops_token + flops_head) / peak_flops * 1e3:.1f} ms")
    for b, row in decode.iterrows():
        print(f"batchlab decode batch {b:>3}: {row.ms_per_step:7.1f} ms  {row.x_floor:5.2f}× floor  "
              f"{row.ms_per_step / b1:5.2f}× batch-1  {row.ms_per_token:6.2f} ms/token")
    for n, row in prefill.iterrows():
        print(f"batchlab prefill {n:>4} tokens: {row.ms_per_step:7.1f} ms  {row.tokens_per_s:7.0f} tokens/s")
    if args.json:
        result = {"bandwidth_GBps": bandwidth / 1e9, "floor_ms": floor, "peak_GFLOPs": peak_flops / 1e9,
                  "transformers_b1_ms": [hf_ms, hf_ms_after], "profile": df.to_dict(orient="records")}
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
