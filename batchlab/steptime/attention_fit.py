"""One layer's attention on one GPU, fitted to vLLM's measured FlashAttention kernels.

AIConfigurator measured attention for uniform batches only: ``batch`` prompts of ``isl`` tokens
(prefill), or ``batch`` decodes over a context of ``step`` tokens. A real step mixes decodes
with prompt chunks over cached prefixes, so a line in what each kernel moves and computes is
fitted per phase (``fit_attention``) and the step is priced from its totals (``AttentionFit``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from batchlab.steptime.cost_model import nnls
from batchlab.checks import fail

QUERY_TILE = 128


def phase_features(phase: str, seqs, tokens, pairs, heads: int, kv_heads: int,
                   head_dim: int) -> np.ndarray:
    """One row per kernel call: 1, sequences, bytes moved, q·k and p·v FLOPs over every query-key
    pair. A decode's bytes are the cached keys and values it reads (one per pair); a prompt's are
    its own queries, keys, values and outputs (the causal pairs reuse them from on-chip memory)."""
    seqs, tokens, pairs = (np.asarray(x, dtype=float) for x in (seqs, tokens, pairs))
    moved = pairs * 2 * kv_heads if phase == "decode" else tokens * (2 * heads + 2 * kv_heads)
    return np.stack([np.ones_like(seqs), seqs, moved * head_dim * 2, pairs * 4 * heads * head_dim],
                    axis=-1)


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
        object.__setattr__(self, "_pre",
                           (pre[0], pre[1], pre[2] * (4 * h + 4 * kv) * d, pre[3] * 4 * h * d,
                                          pre[2] * 4 * kv * d))

    def seconds(self, seqs: int, tokens: int, pairs: int, decode_seqs: int,
                decode_pairs: int) -> float:
        """One layer's attention for a step of ``seqs`` sequences (``decode_seqs`` of them one-token
        decodes with ``decode_pairs`` pairs), ``tokens`` tokens and ``pairs`` query-key pairs."""
        t = 0.0
        if decode_seqs:
            fixed, per_seq, per_pair = self._dec
            t = fixed + per_seq * decode_seqs + per_pair * decode_pairs
        chunks, n, chunk_pairs = seqs - decode_seqs, tokens - decode_seqs, pairs - decode_pairs
        if chunks:
            fixed, per_seq, per_token, per_pair, per_key = self._pre
            # beyond the causal triangles
            cached = max(0.0, chunk_pairs - n * (n / chunks + 1) / 2)
            keys = cached / min(QUERY_TILE, max(1.0, n / chunks))
            t = (max(t, fixed) + per_seq * chunks + per_token * n + per_pair * chunk_pairs
                 + per_key * keys)
        return t


def guess_split(seqs: int, tokens: int, pairs: int) -> tuple[int, int]:
    """``(decode_seqs, decode_pairs)`` of a step known only by its totals, read as vLLM's scheduler
    builds one: every sequence but one decodes, and the prompt chunk is a fresh prompt (a lone
    sequence's pairs are all its chunk's, cached prefix included)."""
    if tokens <= seqs:
        return seqs, pairs
    if seqs == 1:
        return 0, 0
    n = tokens - seqs + 1
    return seqs - 1, max(0, pairs - n * (n + 1) // 2)


def fit_phase(table, phase: str, heads: int, kv_heads: int, head_dim: int):
    """Coefficients of one phase's line, its median error, and the (heads, kv heads) it used."""
    # older tables: no sliding window column
    window = table.window_size if "window_size" in table else 0
    t = table[(table.head_dim == head_dim) & (table.kv_cache_dtype == "bfloat16") & (window == 0)]
    if t.empty:
        fail("head_dim", head_dim, f"one of {sorted(table.head_dim.unique())}",
             "the attention kernels measured")
    # a table may hold the other phase's kernel too
    other = "prefill" if phase == "decode" else "decode"
    sources = ([name for name in t.kernel_source.value_counts().index if other not in name]
               or list(t.kernel_source))
    t = t[t.kernel_source == sources[0]]
    configs = t[["num_heads", "num_key_value_heads"]].drop_duplicates().to_numpy()
    score = np.abs(np.log(configs[:, 0] / heads)) + 2 * np.abs(np.log(configs[:, 1] / kv_heads))
    h, kv = (int(v) for v in configs[int(np.argmin(score))])
    t = t[(t.num_heads == h) & (t.num_key_value_heads == kv)]
    b = t.batch_size.to_numpy(float)
    if phase == "prefill":
        s = t.isl.to_numpy(float)
        # a step's token budget
        tokens, pairs, keep = b * s, b * s * (s + 1) / 2, b * s <= 16384
    else:
        s = t.step.to_numpy(float)
        tokens, pairs, keep = b, b * (s + 1), b * (s + 1) <= 4 * 2**20    # up to 4M cached tokens
    a = phase_features(phase, b, tokens, pairs, h, kv, head_dim)[keep]
    y = t.latency.to_numpy()[keep] * 1e-3
    a_rel = a / y[:, None]                                  # relative errors
    # columns of like size for NNLS
    scale = np.where(a_rel.max(axis=0) > 0, a_rel.max(axis=0), 1.0)
    coef = nnls(a_rel / scale, np.ones_like(y)) / scale
    return tuple(float(c) for c in coef), float(np.median(np.abs(a @ coef / y - 1))), (h, kv)


def fit_attention(context, generation, heads: int, kv_heads: int, head_dim: int) -> AttentionFit:
    """``AttentionFit`` for ``heads`` query and ``kv_heads`` KV heads of ``head_dim`` on one GPU."""
    dec, dec_err, dec_heads = fit_phase(generation, "decode", heads, kv_heads, head_dim)
    pre, pre_err, pre_heads = fit_phase(context, "prefill", heads, kv_heads, head_dim)
    return AttentionFit(dec, pre, heads, kv_heads, head_dim,
                        {"decode": dec_err, "prefill": pre_err},
                        {"decode": dec_heads, "prefill": pre_heads})


__all__ = ["QUERY_TILE", "AttentionFit", "fit_attention", "guess_split", "phase_features"]
