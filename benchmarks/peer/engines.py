"""batchlab's own contenders, and this machine's limits: how fast any engine could serve the workload."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

from .config import BenchConfig
from .contenders import ContenderRun, OpProfile, _profile_extra
from batchlab.requests import Request


# =============================================================================================
# batchlab
# =============================================================================================

def _batchlab_scheduler(name: str, config: BenchConfig):
    """The scheduler a batchlab contender runs, from the package's factory."""
    from batchlab.schedulers import make_scheduler

    if name == "batchlab_static":
        return make_scheduler("static", batch_size=config.batch_size)
    if name == "batchlab_dynamic":
        return make_scheduler("dynamic", max_batch_size=config.batch_size, timeout=config.dynamic_timeout)
    return make_scheduler("continuous", max_num_seqs=config.max_num_seqs,
                          max_num_batched_tokens=config.max_num_batched_tokens)


def run_batchlab(lm, requests: Sequence[Request], name: str, config: BenchConfig,
                 warmup: list[Request] | None) -> ContenderRun:
    """Serve ``requests`` with one of batchlab's engines on the real model.

    Offline the engine runs on its virtual clock (its TTFT/E2E are sums of measured step
    times); online on the wall clock. ``wall_seconds`` is always measured around ``run``.
    """
    from batchlab.backends import ModelBackend
    from batchlab.engine import Engine

    num_slots = config.max_num_seqs if name == "batchlab_continuous" else config.batch_size
    max_seq_len = max(r.max_total_tokens for r in list(requests) + list(warmup or []))
    backend = ModelBackend(lm, num_slots=num_slots, max_seq_len=max_seq_len)
    clock = "virtual" if config.mode == "offline" else "wall"
    if warmup:
        Engine(_batchlab_scheduler(name, config), backend, clock="virtual").run(list(warmup))
    scheduler = _batchlab_scheduler(name, config)
    engine = Engine(scheduler, backend, clock=clock)
    op_profile = OpProfile() if config.profile else contextlib.nullcontext()
    with op_profile:   # entered first: starting and stopping the profiler is not timed
        t0, c0 = time.perf_counter(), time.process_time()
        trace = engine.run(list(requests))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    steps = trace.steps_df()
    prefill_steps = steps["num_prefill_tokens"] > 0
    settings = {"scheduler": repr(scheduler), "clock": clock, "kv_slots": num_slots,
                "max_seq_len": max_seq_len, "backend": backend.describe()}
    extra = {"num_steps": len(steps), "busy_seconds": float(steps["duration"].sum()),
             "prefill_step_seconds": float(steps.loc[prefill_steps, "duration"].sum()),
             "decode_only_step_seconds": float(steps.loc[~prefill_steps, "duration"].sum()),
             "mean_seqs_per_step": float(steps["num_seqs"].mean()) if len(steps) else float("nan"),
             "trace_duration_s": float(trace.duration)}
    if config.profile:
        extra.update(_profile_extra(op_profile, wall))
    del backend
    return ContenderRun(name, trace, wall, cpu, settings, scheduler.streams_tokens, extra)


# =============================================================================================
# This machine's limits
# =============================================================================================

def machine_limits(lm, requests: Sequence[Request]) -> dict:
    """Lower bounds on the time any engine needs for ``requests`` with these weights (in their dtype), here, now.

    - Memory: every step reads all the weights, and the longest request needs one step per
      output token, so ``time >= max_new_tokens * weight bytes / bandwidth``.
    - Compute: every token passes through every weight matrix (2 FLOPs per weight), and every
      output token also through the LM head, so ``time >= FLOPs / matmul speed``.
    Bandwidth and peak matmul speed are measured now, with the current torch threads (best of 5),
    the matmul in the weights' dtype (``_matmul_peak``). Attention and everything else are left
    out, so the true minimum is higher still. In bf16 the fp32 peak is measured too: an engine
    whose kernels widen bf16 weights to fp32 (as on a CPU without bf16 units) is bounded by it
    instead (``bound_tok_s_at_fp32_peak``).
    """
    import torch

    from batchlab.model.profiler import measure_bandwidth

    params = {id(p): p for p in lm.model.parameters()}          # tied weights once
    weight_bytes = sum(p.numel() * p.element_size() for p in params.values())
    head = lm.model.get_output_embeddings().weight                 # (vocab, hidden), tied to the input
    body_params = sum(p.numel() for p in params.values()) - head.numel()
    bandwidth = measure_bandwidth(device=lm.model.device)   # reads a 256 MiB tensor
    matmul_flops, matmul_size = _matmul_peak(head.dtype, lm.model.device)
    prompt = sum(r.prompt_len for r in requests)
    output = sum(r.max_new_tokens for r in requests)
    steps = max(r.max_new_tokens for r in requests)
    flops = 2 * body_params * (prompt + output) + 2 * head.numel() * output
    memory_bound, compute_bound = steps * weight_bytes / bandwidth, flops / matmul_flops
    bound = max(memory_bound, compute_bound)
    limits = {"weight_bytes": weight_bytes, "bandwidth_bytes_s": bandwidth,
              "step_floor_s": weight_bytes / bandwidth, "min_steps": steps,
              "memory_bound_s": memory_bound, "flops": flops,
              "matmul_flops_s": matmul_flops, "matmul_size": matmul_size, "dtype": str(head.dtype),
              "compute_bound_s": compute_bound, "bound_s": bound, "bound_tok_s": output / bound}
    if head.dtype != torch.float32:
        # An engine may widen these weights to fp32 for each product (batchlab does where bf16 is
        # emulated), so its compute bound is the faster of the two measured peaks.
        fp32_flops, _ = _matmul_peak(torch.float32, lm.model.device)
        best = max(fp32_flops, matmul_flops)
        limits.update({"fp32_matmul_flops_s": fp32_flops, "bound_tok_s_dtype_matmul": output / bound,
                       "compute_bound_s": flops / best, "bound_s": max(memory_bound, flops / best)})
        limits["bound_tok_s"] = limits["bound_tok_s_at_fp32_peak"] = output / limits["bound_s"]
    return limits


def _matmul_peak(dtype, device) -> tuple[float, int]:
    """Peak matmul FLOP/s in ``dtype`` and the square size it was measured at: 2048, unless one
    such product would take over 3 s here (bf16 emulated on a CPU without bf16 units ran at
    about 1 GFLOP/s: 17 s a product), then the largest of 1024, 512, 256 that takes under 3 s."""
    from batchlab.model.profiler import measure_matmul_flops

    probe = measure_matmul_flops(size=256, repeats=2, dtype=dtype, device=device)
    size = next((n for n in (2048, 1024, 512) if 2 * n**3 / probe < 3.0), 256)
    return measure_matmul_flops(size=size, dtype=dtype, device=device), size


