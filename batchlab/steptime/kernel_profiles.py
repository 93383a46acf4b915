"""Measured per-layer kernel times (Vidur's profile format) against a device's kernel model.

The rules and their reasons: ``docs/step-time-models.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

import batchlab
from batchlab.steptime.kernels import KernelModel
from batchlab.shapes import LayerShape

SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp")
PROJECTION_COLUMNS = ("attn_pre_proj_ms", "attn_post_proj_ms", "mlp_up_proj_ms", "mlp_down_proj_ms")
SMALL_OP_COLUMNS = ("input_layernorm_ms", "post_attention_layernorm_ms", "attn_rope_ms",
                    "mlp_act_ms", "add_ms")
LAYER_COLUMNS = PROJECTION_COLUMNS + SMALL_OP_COLUMNS
REQUIRED_COLUMNS = SHAPE_COLUMNS + ("tensor_parallel", "num_tokens") + LAYER_COLUMNS
MAX_TOKENS = 4096       # the token counts the presets are checked over: 1 to 4,096
# the course's
KERNEL_PROFILES_DIR = Path(batchlab.__file__).resolve().parents[1] / "data" / "gpu_kernels"


def _check_numbers(path: Path, table: pd.DataFrame) -> None:
    for column in REQUIRED_COLUMNS[:-len(LAYER_COLUMNS)]:
        if column == "use_gated_mlp":
            continue
        values = pd.to_numeric(table[column], errors="coerce")
        bad = values.isna() | (values < 1) | (values != values.round())
        if bad.any():
            raise ValueError(f"{column}={table[column][bad].tolist()[0]!r}; must be an int >= 1 "
                             f"({path.name})")
    for column in LAYER_COLUMNS:
        values = pd.to_numeric(table[column], errors="coerce")
        bad = ~np.isfinite(values) | (values <= 0)
        if bad.any():
            raise ValueError(f"{column}={table[column][bad].tolist()[0]!r}; must be a finite "
                             f"number of milliseconds > 0 ({path.name})")
    gated = table["use_gated_mlp"].map(lambda v: str(v).strip().lower())
    if not gated.isin(["true", "false"]).all():
        raise ValueError("use_gated_mlp="
                         f"{table['use_gated_mlp'][~gated.isin(['true', 'false'])].tolist()[0]!r}; "
                         f"must be True or False ({path.name})")


def read_kernel_profile(path: str | Path) -> pd.DataFrame:
    """A profile file, checked: every required column, numbers where numbers belong, one shape."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"profile={str(path)!r}; must be an existing CSV file in Vidur's format "
                         "(e.g. data/gpu_kernels/h100_Llama-2-7b-hf.csv)")
    table = pd.read_csv(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"columns={missing}; must be present in {path.name} (a profile has "
                         f"{list(REQUIRED_COLUMNS)})")
    if table.empty:
        raise ValueError(f"rows=0; must be at least one in {path.name}")
    _check_numbers(path, table)
    table = table.astype({c: int for c in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd",
                                           "vocab_size", "tensor_parallel", "num_tokens")})
    table["use_gated_mlp"] = table["use_gated_mlp"].map(lambda v: str(v).strip().lower() == "true")
    repeated = table.duplicated(["tensor_parallel", "num_tokens"])
    if repeated.any():
        first = table.loc[repeated, ["tensor_parallel", "num_tokens"]].iloc[0].tolist()
        raise ValueError(f"(tensor_parallel, num_tokens)={tuple(first)}; "
                         f"must appear once in {path.name}")
    shapes = table[list(SHAPE_COLUMNS)].drop_duplicates()
    if len(shapes) > 1:
        raise ValueError(f"shapes={len(shapes)}; must be one model shape per file ({path.name} has "
                         f"{shapes.to_dict('records')})")
    return table


def layer_shape_of(table: pd.DataFrame) -> LayerShape:
    """The layer a profile measured, from its shape columns; every tensor-parallel degree
    checked."""
    row = table.iloc[0]
    heads, kv_heads, hidden = int(row["n_head"]), int(row["n_kv_head"]), int(row["n_embd"])
    if hidden % heads:
        raise ValueError(f"n_embd={hidden}; must be a multiple of n_head={heads} "
                         "(the head size is n_embd / n_head)")
    try:
        layer = LayerShape(hidden, heads, kv_heads, hidden // heads, int(row["n_expanded_embd"]),
                           bool(row["use_gated_mlp"]))
        for tp in sorted(table["tensor_parallel"].unique()):
            layer.check_tensor_parallel(int(tp))
    except ValueError as err:
        raise ValueError(f"{err} (the shape from the file's columns n_head={heads}, "
                         f"n_kv_head={kv_heads}, n_embd={hidden}, "
                         f"n_expanded_embd={int(row['n_expanded_embd'])})") from None
    return layer


def measured_layer_ms(table: pd.DataFrame) -> pd.Series:
    """One layer's measured milliseconds: the four projections and the five small operators."""
    return table[list(LAYER_COLUMNS)].sum(axis=1)


def compare_profile(table: pd.DataFrame, kernels: KernelModel,
                    max_tokens: int = MAX_TOKENS) -> pd.DataFrame:
    """Each row up to ``max_tokens``: ``tensor_parallel``, ``num_tokens``, ``measured_ms``,
    ``predicted_ms`` (one layer on one GPU) and ``error`` (predicted / measured - 1)."""
    layer = layer_shape_of(table)
    rows = table[table["num_tokens"] <= max_tokens].sort_values(["tensor_parallel", "num_tokens"])
    parts = []
    for tp, group in rows.groupby("tensor_parallel"):
        tokens = group["num_tokens"].to_numpy(dtype=float)
        parts.append(pd.DataFrame({
            "tensor_parallel": int(tp), "num_tokens": group["num_tokens"].to_numpy(),
            "measured_ms": measured_layer_ms(group).to_numpy(),
            "predicted_ms": kernels.layer_seconds(layer, tokens, int(tp)) * 1e3}))
    compared = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["tensor_parallel", "num_tokens", "measured_ms", "predicted_ms"])
    compared["error"] = compared["predicted_ms"] / compared["measured_ms"] - 1
    return compared


def compare_projections(table: pd.DataFrame, gemm_seconds,
                        max_tokens: int = MAX_TOKENS) -> pd.DataFrame:
    """A per-kernel cross-check: each row's four projections as the profile measured them against
    ``gemm_seconds(m, n, k)`` (another source's GEMM times, e.g. ``KernelTables.gemm_seconds``):
    ``tensor_parallel``, ``num_tokens``, ``op``, ``measured_ms``, ``predicted_ms``, ``error``."""
    layer = layer_shape_of(table)
    rows = table[table["num_tokens"] <= max_tokens]
    out = []
    for _, row in rows.iterrows():
        tp, m = int(row["tensor_parallel"]), int(row["num_tokens"])
        for column, (k, n) in zip(PROJECTION_COLUMNS, layer.projections(tp)):
            out.append((tp, m, column.removesuffix("_ms"), row[column],
                        gemm_seconds(m, n, k) * 1e3))
    compared = pd.DataFrame(out,
                            columns=["tensor_parallel", "num_tokens", "op", "measured_ms",
                                     "predicted_ms"])
    compared["error"] = compared["predicted_ms"] / compared["measured_ms"] - 1
    return compared


def error_summary(compared: pd.DataFrame) -> tuple[float, float]:
    """Median and worst absolute relative error of ``compare_profile``'s rows."""
    errors = compared["error"].abs().to_numpy(dtype=float)
    if len(errors) == 0:
        raise ValueError("rows=0; must be at least one row within the token range to compare")
    return float(np.median(errors)), float(errors.max())


def guess_device(path: str | Path, devices: Iterable[str]) -> str:
    """The one device name (``A100``, ``H100``, ...) that is a word of the file's name."""
    words = {w.lower() for w in re.split(r"[^A-Za-z0-9]+", Path(path).stem)}
    found = [d for d in devices if d.lower() in words]
    if len(found) != 1:
        raise ValueError(f"device={found or None}; must be named once in the file name "
                         f"{Path(path).name!r}, or given with --device, one of {sorted(devices)}")
    return found[0]
