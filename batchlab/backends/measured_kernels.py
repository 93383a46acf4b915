"""Measured vLLM kernels: AIConfigurator's performance database, read from the installed package.

NVIDIA's AIConfigurator (Apache-2.0) times vLLM's own kernels on each GPU and vLLM version it
supports, and ships the tables as parquet in the package ``aiconfigurator-core``
(``aiconfigurator_core/systems/data/<system>/<op>/vllm/<version>/``). They are read from there,
never copied. ``KernelTables.load(gpu, vllm_version)`` gives:

- ``gemm_seconds(m, n, k)``: a bf16 ``torch.nn.functional.linear`` of ``m`` tokens, interpolated in
  log space between the measured (m, n, k) grid, scaled in proportion past its edges;
- ``attention``: FlashAttention's prefill (``context``: batch x prompt) and decode
  (``generation``: batch x context) times for the heads one GPU holds (``AttentionFit``);
- ``all_reduce_seconds(bytes, gpus, graph)``: vLLM's custom all-reduce inside a CUDA graph or eager;
- ``moe_seconds(tokens, ...)``: vLLM's fused MoE layer (Triton experts, bf16, tokens spread evenly).

``distance`` tells how far a query sits from the nearest measured shape (1.0: measured).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from batchlab.backends.cost_model import nnls
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
        raise ValueError("measured kernels need the package aiconfigurator-core (requirements.txt); "
                         "pip install aiconfigurator-core") from None
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
        return 0, 0, 0.0, 1.0                                  # below the grid: the smallest measured
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


QUERY_TILE = 128


def phase_features(phase: str, seqs, tokens, pairs, heads: int, kv_heads: int, head_dim: int) -> np.ndarray:
    """One row per kernel call: 1, sequences, bytes moved, q·k and p·v FLOPs over every query-key
    pair. A decode's bytes are the cached keys and values it reads (one per pair); a prompt's are
    its own queries, keys, values and outputs (the causal pairs reuse them from on-chip memory)."""
    seqs, tokens, pairs = (np.asarray(x, dtype=float) for x in (seqs, tokens, pairs))
    moved = pairs * 2 * kv_heads if phase == "decode" else tokens * (2 * heads + 2 * kv_heads)
    return np.stack([np.ones_like(seqs), seqs, moved * head_dim * 2, pairs * 4 * heads * head_dim], axis=-1)


@dataclass(frozen=True)
class AttentionFit:
    """One layer's attention on one GPU: a line in ``phase_features`` for decodes, fitted to the
    measured decode kernels, and one for prompt chunks, fitted to the measured prefill kernels
    (each of the measured head configuration nearest to ``heads`` and ``kv_heads``).

    A step's decodes and prompt chunks run in one kernel launch, so the fixed cost is paid once.
    A prompt chunk's pairs beyond its own causal triangle (a cached prefix, earlier chunks) read
    those keys once per tile of ``QUERY_TILE`` queries, priced at the prompt line's byte rate."""

    decode: tuple[float, ...]
    prefill: tuple[float, ...]
    heads: int
    kv_heads: int
    head_dim: int
    median_error: dict          # phase -> median |relative error| of the fit on its rows
    measured_heads: dict        # phase -> (heads, kv heads) the rows came from

    def __post_init__(self) -> None:
        # per-unit costs in scalars (this runs once per simulated step): s per sequence, per pair
        # read or computed, per prompt token moved, per cached key read
        kv, h, d = self.kv_heads, self.heads, self.head_dim
        dec, pre = self.decode, self.prefill
        object.__setattr__(self, "_dec", (dec[0], dec[1], dec[2] * 4 * kv * d + dec[3] * 4 * h * d))
        object.__setattr__(self, "_pre", (pre[0], pre[1], pre[2] * (4 * h + 4 * kv) * d, pre[3] * 4 * h * d,
                                          pre[2] * 4 * kv * d))

    def seconds(self, seqs: int, tokens: int, pairs: int, decode_seqs: int, decode_pairs: int) -> float:
        """One layer's attention for a step of ``seqs`` sequences (``decode_seqs`` of them one-token
        decodes with ``decode_pairs`` pairs), ``tokens`` tokens and ``pairs`` query-key pairs."""
        t = 0.0
        if decode_seqs:
            fixed, per_seq, per_pair = self._dec
            t = fixed + per_seq * decode_seqs + per_pair * decode_pairs
        chunks, n, chunk_pairs = seqs - decode_seqs, tokens - decode_seqs, pairs - decode_pairs
        if chunks:
            fixed, per_seq, per_token, per_pair, per_key = self._pre
            cached = max(0.0, chunk_pairs - n * (n / chunks + 1) / 2)      # beyond the causal triangles
            keys = cached / min(QUERY_TILE, max(1.0, n / chunks))
            t = max(t, fixed) + per_seq * chunks + per_token * n + per_pair * chunk_pairs + per_key * keys
        return t


def guess_split(seqs: int, tokens: int, pairs: int) -> tuple[int, int]:
    """``(decode_seqs, decode_pairs)`` of a step known only by its totals, read as vLLM's scheduler
    builds one: every sequence but one decodes, and the prompt chunk is a fresh prompt."""
    if tokens <= seqs:
        return seqs, pairs
    n = tokens - seqs + 1
    return seqs - 1, max(0, pairs - n * (n + 1) // 2)


def fit_phase(table, phase: str, heads: int, kv_heads: int, head_dim: int):
    """Coefficients of one phase's line, its median error, and the (heads, kv heads) it used."""
    window = table.window_size if "window_size" in table else 0     # older tables: no sliding window column
    t = table[(table.head_dim == head_dim) & (table.kv_cache_dtype == "bfloat16") & (window == 0)]
    if t.empty:
        fail("head_dim", head_dim, f"one of {sorted(table.head_dim.unique())}", "the attention kernels measured")
    other = "prefill" if phase == "decode" else "decode"          # a table may hold the other phase's kernel too
    sources = [name for name in t.kernel_source.value_counts().index if other not in name] or list(t.kernel_source)
    t = t[t.kernel_source == sources[0]]
    configs = t[["num_heads", "num_key_value_heads"]].drop_duplicates().to_numpy()
    score = np.abs(np.log(configs[:, 0] / heads)) + 2 * np.abs(np.log(configs[:, 1] / kv_heads))
    h, kv = (int(v) for v in configs[int(np.argmin(score))])
    t = t[(t.num_heads == h) & (t.num_key_value_heads == kv)]
    b = t.batch_size.to_numpy(float)
    if phase == "prefill":
        s = t.isl.to_numpy(float)
        tokens, pairs, keep = b * s, b * s * (s + 1) / 2, b * s <= 16384       # a step's token budget
    else:
        s = t.step.to_numpy(float)
        tokens, pairs, keep = b, b * (s + 1), b * (s + 1) <= 4 * 2**20    # up to 4M cached tokens
    a = phase_features(phase, b, tokens, pairs, h, kv, head_dim)[keep]
    y = t.latency.to_numpy()[keep] * 1e-3
    a_rel = a / y[:, None]                                  # relative errors
    scale = np.where(a_rel.max(axis=0) > 0, a_rel.max(axis=0), 1.0)   # columns of like size for NNLS
    coef = nnls(a_rel / scale, np.ones_like(y)) / scale
    return tuple(float(c) for c in coef), float(np.median(np.abs(a @ coef / y - 1))), (h, kv)


def fit_attention(context, generation, heads: int, kv_heads: int, head_dim: int) -> AttentionFit:
    """``AttentionFit`` for ``heads`` query and ``kv_heads`` KV heads of ``head_dim`` on one GPU."""
    dec, dec_err, dec_heads = fit_phase(generation, "decode", heads, kv_heads, head_dim)
    pre, pre_err, pre_heads = fit_phase(context, "prefill", heads, kv_heads, head_dim)
    return AttentionFit(dec, pre, heads, kv_heads, head_dim, {"decode": dec_err, "prefill": pre_err},
                        {"decode": dec_heads, "prefill": pre_heads})


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
        return float(np.exp(np.interp(math.log(max(num_bytes, size[0])), np.log(size), np.log(secs))))


@dataclass(frozen=True, eq=False)
class KernelTables:
    """The measured tables of one GPU (``system``) at the vLLM versions chosen for each op."""

    gpu: str
    system: str
    versions: dict
    gemm: GemmTable
    all_reduce: AllReduceTable | None
    _context: object = field(repr=False, compare=False)
    _generation: object = field(repr=False, compare=False)
    _moe: object = field(repr=False, compare=False)

    @classmethod
    def load(cls, gpu: str, vllm_version: str | None = None) -> "KernelTables":
        return _load(gpu, vllm_version)

    def describe(self, wanted: str | None = None) -> str:
        """Which tables, at which vLLM versions; a version other than ``wanted`` is flagged."""
        parts = ", ".join(f"{op} {v}" + (f" (WARNING: none measured at {wanted}; the nearest)"
                                         if wanted and version_key(v) != version_key(wanted) else "")
                          for op, v in self.versions.items() if v)
        return f"measured vLLM kernels on {self.system} (AIConfigurator's database: {parts})"

    @functools.lru_cache(maxsize=None)
    def attention(self, heads: int, kv_heads: int, head_dim: int) -> AttentionFit:
        return fit_attention(self._context, self._generation, heads, kv_heads, head_dim)

    def gemm_seconds(self, m: float, n: float, k: float) -> float:
        return self.gemm.seconds(m, n, k)

    def all_reduce_seconds(self, num_bytes: float, num_gpus: int, graph: bool) -> float:
        if self.all_reduce is None:
            fail("tensor_parallel_size", num_gpus, "1", f"no all-reduce was measured on {self.system}")
        return self.all_reduce.seconds(num_bytes, num_gpus, graph)

    @functools.lru_cache(maxsize=None)
    def moe_curve(self, hidden: int, inter: int, topk: int, experts: int, tp: int, ep: int):
        """Token counts and seconds of the fused MoE layer measured for exactly this shape."""
        if self._moe is None:
            fail("gpu", self.gpu, "a GPU with measured MoE kernels", "no MoE table for it")
        t = self._moe
        t = t[(t.kernel_source == MOE_SOURCE) & (t.distribution == "balanced") & (t.hidden_size == hidden)
              & (t.inter_size == inter) & (t.topk == topk) & (t.num_experts == experts)
              & (t.moe_tp_size == tp) & (t.moe_ep_size == ep)].sort_values("num_tokens")
        if t.empty:
            measured = sorted({tuple(int(v) for v in r) for r in self._moe[
                ["hidden_size", "inter_size", "topk", "num_experts"]].drop_duplicates().to_numpy()})
            fail("moe shape", (hidden, inter, topk, experts, tp, ep),
                 f"(hidden, intermediate, top-k, experts) of a measured MoE layer on {self.system}: {measured}",
                 "with this TP/EP split")
        return t.num_tokens.to_numpy(float), t.latency.to_numpy() * 1e-3

    def moe_seconds(self, tokens: float, hidden: int, inter: int, topk: int, experts: int, tp: int, ep: int) -> float:
        x, y = self.moe_curve(hidden, inter, topk, experts, tp, ep)
        if tokens >= x[-1]:
            return float(y[-1] * tokens / x[-1])
        return float(np.exp(np.interp(math.log(max(tokens, x[0])), np.log(x), np.log(y))))


@functools.lru_cache(maxsize=None)
def _load(gpu: str, vllm_version: str | None) -> KernelTables:
    if gpu not in SYSTEMS:
        fail("gpu", gpu, f"one of {sorted(SYSTEMS)}", "a GPU whose vLLM kernels AIConfigurator measured")
    system = SYSTEMS[gpu]
    ops = {"gemm": ("gemm", "gemm"), "attention": ("attention", "context_attention"),
           "all_reduce": ("comm", "custom_allreduce"), "moe": ("moe", "moe")}
    versions = {name: pick_version(system, folder, vllm_version) for name, (folder, _) in ops.items()}
    for name in ("gemm", "attention"):
        if versions[name] is None:
            fail("gpu", gpu, f"one of {sorted(SYSTEMS)}", f"no measured vLLM {name} kernels in {system}")
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
    return KernelTables(gpu, system, versions, GemmTable.from_frame(gemm), comm or None, context, generation, moe)


__all__ = ["SYSTEMS", "AllReduceTable", "AttentionFit", "GemmTable", "KernelTables", "fit_attention", "guess_split"]
