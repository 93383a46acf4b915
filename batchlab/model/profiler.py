"""Measuring what a step costs on this machine: the numbers behind "8 cost about as much as 1".

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable

import pandas as pd
import torch

from batchlab.checks import check_int
from batchlab.model.environment import synchronize
from batchlab.model.llama import LlamaWeights, SeqChunk, forward_step


def measure_bandwidth(num_bytes: int = 256 * 2**20, repeats: int = 5,
                      device: str | torch.device = "cpu") -> float:
    """Memory read bandwidth in bytes/s: the best of ``repeats`` sums over a large fp32 tensor."""
    if num_bytes < 2**20:
        raise ValueError(f"num_bytes={num_bytes}; use at least 1 MiB "
                         "(ideally more than the caches)")
    device = torch.device(device)
    data = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    data.sum()
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        data.sum()
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return data.numel() * 4 / best


def measure_matmul_flops(size: int = 2048, repeats: int = 5, dtype: torch.dtype = torch.float32,
                         device: str | torch.device = "cpu") -> float:
    """Peak matmul throughput in FLOP/s: the best of ``repeats`` (size × size) @ (size × size)
    products. It is the compute ceiling of the roofline, as ``measure_bandwidth`` is the memory
    one."""
    if size < 64:
        raise ValueError(f"size={size}; use at least 64 (ideally 1024 or more)")
    device = torch.device(device)
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best


def time_step(weights: LlamaWeights, cache, chunks: list[SeqChunk], repeats: int = 5) -> float:
    """Median seconds of ``forward_step`` over ``repeats`` runs, after one warm-up run."""
    forward_step(weights, cache, chunks)
    times = []
    for _ in range(repeats):
        synchronize(weights.device)
        t0 = time.perf_counter()
        forward_step(weights, cache, chunks)
        synchronize(weights.device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _random_ids(n: int, vocab: int, gen: torch.Generator) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=gen).tolist()


def _time_jobs(weights: LlamaWeights, cache, jobs: list[tuple[str, int, int]], repeats: int,
               floor_ms: float, progress: bool) -> list[dict]:
    """Time each (kind, size, context) step shape; one row each (``profile_steps``'s columns)."""
    gen = torch.Generator().manual_seed(0)
    vocab = weights.config.vocab_size
    if progress:
        from tqdm.auto import tqdm
        jobs = tqdm(jobs, desc="profiling steps")
    rows = []
    for kind, size, ctx in jobs:
        if kind == "prefill":
            chunks = [SeqChunk(0, 0, _random_ids(size, vocab, gen), True)]
            batch, tokens = 1, size
        else:
            chunks = [SeqChunk(s, ctx, _random_ids(1, vocab, gen), True) for s in range(size)]
            batch, tokens = size, size
        seconds = time_step(weights, cache, chunks, repeats)
        rows.append({"kind": kind, "batch_size": batch, "num_tokens": tokens, "context_len": ctx,
                     "ms_per_step": seconds * 1e3, "ms_per_token": seconds * 1e3 / tokens,
                     "tokens_per_s": tokens / seconds, "floor_ms": floor_ms,
                     "x_floor": seconds * 1e3 / floor_ms})
    return rows


def profile_steps(weights: LlamaWeights,
                  batch_sizes: Iterable[int] = (1, 2, 4, 8, 16, 32, 64),
                  context_len: int = 64,
                  prefill_sizes: Iterable[int] = (16, 64, 256),
                  context_lens: Iterable[int] = (),
                  context_batch: int = 8,
                  repeats: int = 5,
                  bandwidth: float | None = None,
                  progress: bool = False) -> pd.DataFrame:
    """Time real steps; one row per measured step shape.

    kind="decode": ``batch_size`` sequences each decode one token at position ``context_len``.
    kind="prefill": one sequence prefills a chunk of ``num_tokens`` tokens from position 0.
    kind="context": ``context_batch`` sequences decode at each of ``context_lens``.

    Columns: kind, batch_size, num_tokens, context_len, ms_per_step, ms_per_token,
    tokens_per_s, floor_ms (weight bytes / measured bandwidth), x_floor (ms_per_step / floor_ms).
    """
    batch_sizes, prefill_sizes, context_lens = (list(batch_sizes), list(prefill_sizes),
                                                list(context_lens))
    for name, values in [("batch_sizes", batch_sizes), ("prefill_sizes", prefill_sizes),
                         ("context_lens", context_lens)]:
        for i, v in enumerate(values):
            check_int(f"{name}[{i}]", v)
    check_int("repeats", repeats)
    bandwidth = bandwidth or measure_bandwidth(device=weights.device)
    jobs = [("decode", b, context_len) for b in batch_sizes]
    jobs += [("prefill", n, 0) for n in prefill_sizes]
    jobs += [("context", context_batch, c) for c in context_lens]
    max_len = max([context_len + 1] + [n for n in prefill_sizes] + [c + 1 for c in context_lens])
    slots = max(batch_sizes + [context_batch if context_lens else 1])
    cache = weights.new_kv_cache(slots, max_len)   # scratch cache; its contents are irrelevant
    rows = _time_jobs(weights, cache, jobs, repeats, weights.num_bytes() / bandwidth * 1e3,
                      progress)
    df = pd.DataFrame(rows)
    df.attrs.update(bandwidth_GBps=bandwidth / 1e9, weight_MB=weights.num_bytes() / 1e6,
                    device=str(weights.device), dtype=str(weights.dtype).replace("torch.", ""))
    return df
