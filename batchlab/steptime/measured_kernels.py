"""Measured vLLM kernels: AIConfigurator's performance database, read from the installed package.

The rules and their reasons: ``docs/step-time-models.md``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from batchlab.steptime.attention_fit import AttentionFit, fit_attention
from batchlab.checks import fail

# batchlab's GPU presets -> AIConfigurator's system folders (SXM boards, the ones it measured).
SYSTEMS = {"H100": "h100_sxm", "H200": "h200_sxm", "A100": "a100_sxm"}
GEMM_SOURCE = "torch.nn.functional.linear"
MOE_SOURCE = "vllm_unquantizedfusedmoe_triton_tritonexperts"


def data_root() -> Path:
    """Where the installed ``aiconfigurator-core`` keeps its measured tables."""
    try:
        import aiconfigurator_core
    except ImportError:
        raise ValueError("measured kernels need the package aiconfigurator-core "
                         "(requirements.txt); pip install aiconfigurator-core") from None
    return Path(aiconfigurator_core.__file__).resolve().parent / "systems" / "data"


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in version.replace("rc", ".").split("."))


def measured_versions(system: str, op: str) -> list[str]:
    """The vLLM versions a system's ``op`` folder holds, oldest first."""
    folder = data_root() / system / op / "vllm"
    names = [p.name for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []
    return sorted(names, key=version_key)


def pick_version(system: str, op: str, wanted: str | None) -> str | None:
    """The newest measured version; with ``wanted``, the newest at or below it, else the oldest
    above it (the nearest measured); None when the op was never measured on this system."""
    versions = measured_versions(system, op)
    if wanted is not None and versions:
        below = [v for v in versions if version_key(v) <= version_key(wanted)]
        return below[-1] if below else versions[0]
    return versions[-1] if versions else None


def read_table(system: str, op: str, version: str, name: str):
    import pandas as pd

    return pd.read_parquet(data_root() / system / op / "vllm" / version / f"{name}_perf.parquet")


def log_axis_weights(axis: np.ndarray, x: float) -> tuple[int, int, float, float]:
    """Bracketing indices of ``x`` on a sorted ``axis``, the log-space weight of the upper one, and
    the factor that scales past the edges (1 inside)."""
    if x <= axis[0]:
        # below the grid: the smallest measured
        return 0, 0, 0.0, 1.0
    if x >= axis[-1]:
        return len(axis) - 1, len(axis) - 1, 0.0, x / axis[-1]  # above: in proportion
    hi = int(np.searchsorted(axis, x))
    lo = hi - 1
    w = math.log(x / axis[lo]) / math.log(axis[hi] / axis[lo])
    return lo, hi, w, 1.0


def nearest_ratio(axis: np.ndarray, x: float) -> float:
    """How far ``x`` is from the nearest value of ``axis``, as a ratio >= 1."""
    i = int(np.argmin(np.abs(np.log(axis) - math.log(max(x, 1e-9)))))
    return max(axis[i] / x, x / axis[i])


@dataclass(frozen=True)
class GemmTable:
    """Log-latencies on a full (m, n, k) grid; missing points filled along m."""

    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    log_s: np.ndarray     # (len(m), len(n), len(k)) log seconds

    @classmethod
    def from_frame(cls, df) -> "GemmTable":
        m, n, k = (np.array(sorted(df[c].unique()), dtype=float) for c in ("m", "n", "k"))
        grid = np.full((len(m), len(n), len(k)), np.nan)
        grid[np.searchsorted(m, df.m), np.searchsorted(n, df.n), np.searchsorted(k, df.k)] = np.log(
            df.latency.to_numpy() * 1e-3)
        for j in range(len(n)):            # a hole on the m axis: the neighbours' log-linear mean
            for i in range(len(k)):
                col, ok = grid[:, j, i], ~np.isnan(grid[:, j, i])
                if ok.any() and not ok.all():
                    col[~ok] = np.interp(np.log(m[~ok]), np.log(m[ok]), col[ok])
        return cls(m, n, k, grid)

    def seconds(self, m: float, n: float, k: float) -> float:
        (m0, m1, wm, sm), (n0, n1, wn, sn), (k0, k1, wk, sk) = (
            log_axis_weights(self.m, m), log_axis_weights(self.n, n), log_axis_weights(self.k, k))
        g = self.log_s
        total = 0.0
        for mi, a in ((m0, 1 - wm), (m1, wm)):
            for ni, b in ((n0, 1 - wn), (n1, wn)):
                for ki, c in ((k0, 1 - wk), (k1, wk)):
                    if a * b * c:
                        total += a * b * c * g[mi, ni, ki]
        return math.exp(total) * sm * sn * sk

    def distance(self, m: float, n: float, k: float) -> float:
        return max(nearest_ratio(self.m, m), nearest_ratio(self.n, n), nearest_ratio(self.k, k))


@dataclass(frozen=True)
class AllReduceTable:
    """Seconds by message bytes, per GPU count and mode (``graph`` or ``eager``)."""

    curves: dict   # (num_gpus, graph) -> (bytes array, seconds array)

    @classmethod
    def from_frame(cls, df) -> "AllReduceTable":
        curves = {}
        df = df[df.allreduce_dtype == "bfloat16"]
        for (gpus, source), t in df.groupby(["num_gpus", "kernel_source"]):
            t = t.sort_values("message_size")
            # message_size counts bf16 elements (the collector allocates [tokens, 4096] of them)
            curves[int(gpus), source.endswith("graph")] = (t.message_size.to_numpy(float) * 2,
                                                          t.latency.to_numpy() * 1e-3)
        return cls(curves)

    def gpu_counts(self) -> list[int]:
        return sorted({g for g, _ in self.curves})

    def seconds(self, num_bytes: float, num_gpus: int, graph: bool) -> float:
        key = (num_gpus, graph) if (num_gpus, graph) in self.curves else (num_gpus, not graph)
        if key not in self.curves:
            fail("tensor_parallel_size", num_gpus, f"one of {self.gpu_counts()}",
                 "the GPU counts whose all-reduce was measured on this GPU")
        size, secs = self.curves[key]
        if num_bytes >= size[-1]:
            return float(secs[-1] * num_bytes / size[-1])
        return float(np.exp(np.interp(math.log(max(num_bytes, size[0])), np.log(size),
                                      np.log(secs))))


@dataclass(frozen=True, eq=False)
class KernelTables:
    """The measured tables of one GPU (``system``) at the vLLM versions chosen for each op."""

    gpu: str
    system: str
    versions: dict
    gemm: GemmTable = field(repr=False)
    all_reduce: AllReduceTable | None = field(repr=False)
    _context: object = field(repr=False, compare=False)
    _generation: object = field(repr=False, compare=False)
    _moe: object = field(repr=False, compare=False)

    @classmethod
    def load(cls, gpu: str, vllm_version: str | None = None) -> "KernelTables":
        return _load(gpu, vllm_version)

    def describe(self, wanted: str | None = None) -> str:
        """Which tables, at which vLLM versions; a version other than ``wanted`` is flagged."""
        parts = ", ".join(f"{op} {v}" + (f" (WARNING: none measured at {wanted}; the nearest)"
                                         if wanted and version_key(v) != version_key(wanted)
                                         else "")
                          for op, v in self.versions.items() if v)
        return f"measured vLLM kernels on {self.system} (AIConfigurator's database: {parts})"

    @functools.lru_cache(maxsize=None)
    def attention(self, heads: int, kv_heads: int, head_dim: int) -> AttentionFit:
        return fit_attention(self._context, self._generation, heads, kv_heads, head_dim)

    def gemm_seconds(self, m: float, n: float, k: float) -> float:
        return self.gemm.seconds(m, n, k)

    def all_reduce_seconds(self, num_bytes: float, num_gpus: int, graph: bool) -> float:
        if self.all_reduce is None:
            fail("tensor_parallel_size", num_gpus, "1",
                 f"no all-reduce was measured on {self.system}")
        return self.all_reduce.seconds(num_bytes, num_gpus, graph)

    @functools.lru_cache(maxsize=None)
    def moe_curve(self, hidden: int, inter: int, topk: int, experts: int, tp: int, ep: int):
        """Token counts and seconds of the fused MoE layer measured for exactly this shape."""
        if self._moe is None:
            fail("gpu", self.gpu, "a GPU with measured MoE kernels", "no MoE table for it")
        t = self._moe
        t = t[(t.kernel_source == MOE_SOURCE) & (t.distribution == "balanced")
              & (t.hidden_size == hidden) & (t.inter_size == inter) & (t.topk == topk)
              & (t.num_experts == experts) & (t.moe_tp_size == tp)
              & (t.moe_ep_size == ep)].sort_values("num_tokens")
        if t.empty:
            measured = sorted({tuple(int(v) for v in r) for r in self._moe[
                ["hidden_size", "inter_size", "topk", "num_experts"]].drop_duplicates().to_numpy()})
            fail("moe shape", (hidden, inter, topk, experts, tp, ep),
                 f"(hidden, intermediate, top-k, experts) of a measured MoE layer on "
                 f"{self.system}: {measured}",
                 "with this TP/EP split")
        return t.num_tokens.to_numpy(float), t.latency.to_numpy() * 1e-3

    def moe_seconds(self, tokens: float, hidden: int, inter: int, topk: int, experts: int, tp: int,
                    ep: int) -> float:
        x, y = self.moe_curve(hidden, inter, topk, experts, tp, ep)
        if tokens >= x[-1]:
            return float(y[-1] * tokens / x[-1])
        return float(np.exp(np.interp(math.log(max(tokens, x[0])), np.log(x), np.log(y))))


@functools.lru_cache(maxsize=None)
def _load(gpu: str, vllm_version: str | None) -> KernelTables:
    if gpu not in SYSTEMS:
        fail("gpu", gpu, f"one of {sorted(SYSTEMS)}",
             "a GPU whose vLLM kernels AIConfigurator measured")
    system = SYSTEMS[gpu]
    ops = {"gemm": ("gemm", "gemm"), "attention": ("attention", "context_attention"),
           "all_reduce": ("comm", "custom_allreduce"), "moe": ("moe", "moe")}
    versions = {name: pick_version(system, folder, vllm_version)
                for name, (folder, _) in ops.items()}
    for name in ("gemm", "attention"):
        if versions[name] is None:
            fail("gpu", gpu, f"one of {sorted(SYSTEMS)}",
                 f"no measured vLLM {name} kernels in {system}")
    gemm = read_table(system, "gemm", versions["gemm"], "gemm")
    gemm = gemm[gemm.gemm_dtype == "bfloat16"]
    if (gemm.kernel_source == GEMM_SOURCE).any():       # older tables name it vllm_default
        gemm = gemm[gemm.kernel_source == GEMM_SOURCE]
    context = read_table(system, "attention", versions["attention"], "context_attention")
    generation = read_table(system, "attention", versions["attention"], "generation_attention")
    comm = versions["all_reduce"] and AllReduceTable.from_frame(
        read_table(system, "comm", versions["all_reduce"], "custom_allreduce"))
    moe = versions["moe"] and read_table(system, "moe", versions["moe"], "moe")
    moe = moe[moe.moe_dtype == "bfloat16"] if versions["moe"] else None
    return KernelTables(gpu, system, versions, GemmTable.from_frame(gemm), comm or None, context,
                        generation, moe)


__all__ = ["SYSTEMS", "AllReduceTable", "GemmTable", "KernelTables"]
