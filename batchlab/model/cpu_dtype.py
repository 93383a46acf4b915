"""Which dtype ``load_model(dtype="auto")`` picks on a CPU: fp32, unless a measured probe says bf16.

bf16 halves the bytes every step reads, but a CPU computes it fast only with bf16 matrix units
(``amx_bf16`` or ``avx512_bf16`` in /proc/cpuinfo). Without them torch emulates it, many times
slower than fp32 (on the course's AVX2 VM a 576 x 1536 matmul of one row took 2.6 ms in bf16
against 0.28 ms in fp32). Even with them, a batch-1 decode was measured slower in bf16 (49.6 ms
against 33 ms), while prefill and large batches were faster. So the rule is:

1. no bf16 flags → fp32, nothing measured;
2. bf16 flags → time the matmuls of one layer of the course's model, in both dtypes, at one row
   (a batch-1 decode) and at 256 rows (a prompt); bf16 only if it is faster at BOTH sizes.
   The verdict is saved per CPU model and torch version in the model cache, so it is measured
   once per machine, not at every load.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

# SmolLM2-135M's hidden size and its MLP's gate+up width, the shapes of most of a step's work.
PROBE_SHAPES = ((576, 1536 * 2), (1536, 576), (576, 960))
PROBE_ROWS = (1, 256)
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_bf16_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> list[str]:
    """The bf16 matrix-unit flags this CPU reports (empty when none, or no /proc/cpuinfo)."""
    try:
        with open(cpuinfo) as f:
            flags = next(line for line in f if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags if f in BF16_FLAGS)


def time_layer_matmuls(dtype: torch.dtype, rows: int, repeats: int = 5) -> float:
    """Best-of-``repeats`` seconds for one layer's projections (``PROBE_SHAPES``) over ``rows`` rows."""
    gen = torch.Generator().manual_seed(0)
    mats = [torch.randn(i, o, generator=gen).to(dtype) for i, o in PROBE_SHAPES]
    xs = [torch.randn(rows, i, generator=gen).to(dtype) for i, _ in PROBE_SHAPES]
    best = float("inf")
    for _ in range(repeats + 1):                   # the first round warms up
        t0 = time.perf_counter()
        for x, w in zip(xs, mats):
            x @ w
        best = min(best, time.perf_counter() - t0)
    return best


def probe_cpu_dtypes(repeats: int = 5) -> dict:
    """Measured seconds per dtype and row count, and whether bf16 won at every size."""
    times = {name: {str(r): time_layer_matmuls(getattr(torch, name), r, repeats) for r in PROBE_ROWS}
             for name in ("float32", "bfloat16")}
    faster = all(times["bfloat16"][str(r)] < times["float32"][str(r)] for r in PROBE_ROWS)
    return {"seconds": times, "bf16_faster": faster}


def pick_cpu_dtype(cache_file: Path | None = None, cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """"float32" or "bfloat16" for ``dtype="auto"`` on this CPU, by the rule in the module doc."""
    if not cpu_bf16_flags(cpuinfo):
        return "float32"
    from batchlab.model.environment import device_name

    key = f"{device_name('cpu')} | torch {torch.__version__} | threads {torch.get_num_threads()}"
    saved = {}
    if cache_file is not None and cache_file.exists():
        try:
            saved = json.loads(cache_file.read_text())
        except ValueError:
            saved = {}
    if key not in saved:
        saved[key] = probe_cpu_dtypes()
        if cache_file is not None:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            cache_file.write_text(json.dumps(saved, indent=1))
    return "bfloat16" if saved[key]["bf16_faster"] else "float32"
