"""Which dtype ``load_model(dtype="auto")`` picks on a CPU: fp32, unless a measured probe says bf16.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from batchlab.model.cpu_products import StepProducts, cpu_bf16_flags, onednn_isa_cap

# SmolLM2-135M's products: one layer's fused q/k/v, output, gate+up and down projections as
# (in, out) shapes, its layer count, and the LM head.
PROBE_SHAPES = ((576, 960), (576, 576), (576, 1536 * 2), (1536, 576))
PROBE_LAYERS = 30
PROBE_HEAD = (576, 49152)
PROBE_ROWS = (1, 256)
PROBE_VERSION = 2      # part of the saved verdict's key: a new probe measures again


def product_timer(w: torch.Tensor, rows: int):
    """A function that computes ``x @ w`` over ``rows`` rows by the step's route for ``w``'s dtype
    (``StepProducts``, as the step does), warmed up: oneDNN builds and packs its kernel at a
    product's first calls, which a steady-state step never pays."""
    x = torch.randn(rows, w.shape[0], generator=torch.Generator().manual_seed(1)).to(w.dtype)
    products = StepProducts([w], w.dtype, "cpu")

    def product():
        return products(x, w)
    for _ in range(3):
        product()
    return product


def best_seconds(fn, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``fn``."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def step_products(dtype: torch.dtype, rows: int):
    """A function returning the seconds of one step's products of the course's model over ``rows``
    rows in ``dtype``: ``PROBE_LAYERS`` x one layer's projections + the LM head, each timed warm."""
    gen = torch.Generator().manual_seed(0)
    layer = [product_timer((torch.randn(*s, generator=gen) / s[0] ** 0.5).to(dtype), rows)
             for s in PROBE_SHAPES]
    head = product_timer((torch.randn(*PROBE_HEAD, generator=gen) / PROBE_HEAD[0] ** 0.5).to(dtype),
                         rows)
    return lambda repeats: (PROBE_LAYERS * sum(best_seconds(p, repeats) for p in layer)
                            + best_seconds(head, repeats))


def probe_cpu_dtypes(repeats: int = 3, rounds: int = 3) -> dict:
    """Measured seconds per dtype and row count, and whether bf16 won at every size.

    The two dtypes are timed in alternating rounds and each keeps its best, so a burst of other
    work on the machine slows both alike rather than deciding the verdict."""
    timers = {(name, r): step_products(getattr(torch, name), r)
              for name in ("float32", "bfloat16") for r in PROBE_ROWS}
    best = dict.fromkeys(timers, float("inf"))
    for _ in range(rounds):
        for key, timer in timers.items():
            best[key] = min(best[key], timer(repeats))
    times = {name: {str(r): best[name, r] for r in PROBE_ROWS} for name in ("float32", "bfloat16")}
    faster = all(times["bfloat16"][str(r)] < times["float32"][str(r)] for r in PROBE_ROWS)
    return {"seconds": times, "bf16_faster": faster}


def pick_cpu_dtype(cache_file: Path | None = None, cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """"float32" or "bfloat16" for ``dtype="auto"`` on this CPU, by the rule in the module doc."""
    if not cpu_bf16_flags(cpuinfo):
        return "float32"
    from batchlab.model.environment import device_name

    key = (f"{device_name('cpu')} | torch {torch.__version__} | threads {torch.get_num_threads()}"
           f" | oneDNN ISA {onednn_isa_cap() or 'all'} | probe {PROBE_VERSION}")
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
