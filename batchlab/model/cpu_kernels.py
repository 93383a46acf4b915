"""Which kernels this CPU runs the step's products with: what a benchmark prints before its figures.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from batchlab.model.cpu_products import cpu_bf16_flags, onednn_isa_cap

KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
# One packed product per dtype, of a SmolLM2 projection's shape, in a process with oneDNN's log on.
_PROBE = """
import torch
for dtype in (torch.float32, torch.bfloat16):
    x, w = torch.randn(8, 576, dtype=dtype), torch.randn(1536, 576, dtype=dtype)
    packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 32)
    torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    print("batchlab-probe-done", dtype, flush=True)
"""


def cpu_kernel_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> list[str]:
    """The flags of ``KERNEL_FLAGS`` this CPU reports, in that order (empty without
    /proc/cpuinfo)."""
    try:
        with open(cpuinfo) as f:
            flags = set(next(line for line in f if line.startswith("flags")).split())
    except (OSError, StopIteration):
        return []
    return [f for f in KERNEL_FLAGS if f in flags]


def parse_onednn_log(text: str) -> dict[str, str | None]:
    """From oneDNN's verbose log of ``_PROBE``: ``isa`` (its "cpu,isa:" line) and the kernel of each
    inner product it ran, in order: ``fp32_kernel``, ``bf16_kernel`` (e.g.
    ``brg_matmul:avx512_core_amx``)."""
    isa, kernels = None, []
    for line in text.splitlines():
        parts = line.split(",")
        if line.startswith("onednn_verbose") and ",info,cpu,isa:" in line:
            isa = line.split("isa:", 1)[1].strip()
        elif (line.startswith("onednn_verbose") and "primitive,exec,cpu,inner_product" in line
              and len(parts) > 6):
            kernels.append(parts[6])
    return {"isa": isa, "fp32_kernel": kernels[0] if kernels else None,
            "bf16_kernel": kernels[1] if len(kernels) > 1 else None}


def kernel_report(timeout: float = 120.0) -> dict:
    """This CPU's kernel facts (see the module docstring): ``flags``, ``onednn_isa_cap`` (None when
    uncapped), ``bf16_units`` (the bf16 flags oneDNN may use under that cap), ``torch_capability``
    (torch's own vectorized kernels: ``AVX512``, ``AVX2``, ...), and oneDNN's ``isa``,
    ``fp32_kernel`` and ``bf16_kernel`` (None where the probe could not run or said nothing)."""
    import torch

    report: dict = {"flags": cpu_kernel_flags(), "onednn_isa_cap": onednn_isa_cap(),
                    "bf16_units": cpu_bf16_flags(),
                    "torch_capability": torch.backends.cpu.get_cpu_capability()}
    env = {**os.environ, "ONEDNN_VERBOSE": "1", "OMP_NUM_THREADS": "1"}
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                             text=True, timeout=timeout)
        log = out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        log = f"probe failed: {e}"
    found = parse_onednn_log(log)
    if found["bf16_kernel"] is None and "batchlab-probe-done torch.float32" in log \
            and "batchlab-probe-done torch.bfloat16" not in log:
        found["bf16_kernel"] = "none (oneDNN refused a bf16 product here)"
    return {**report, **found}


def describe_kernels(report: dict) -> str:
    """One line for a benchmark's header."""
    flags = " ".join(report["flags"]) or "none of " + "/".join(KERNEL_FLAGS)
    cap = report["onednn_isa_cap"] or "none"
    return (
        f"CPU flags {flags}; oneDNN ISA {report['isa'] or 'unknown'} "
        f"(ONEDNN_MAX_CPU_ISA cap: {cap}); "
        f"packed products fp32 {report['fp32_kernel'] or 'unknown'}, "
        f"bf16 {report['bf16_kernel'] or 'unknown'}"
        f"{'' if report['bf16_units'] else ' (no usable bf16 units: the step widens bf16 to fp32)'}"
        f"; torch kernels {report['torch_capability']}")


__all__ = ["KERNEL_FLAGS", "cpu_kernel_flags", "describe_kernels", "kernel_report",
           "parse_onednn_log"]
