"""Fit a device's ``KernelEfficiency`` to measured per-layer kernel times, in three stages.

The rules and their reasons: ``docs/step-time-models.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial

import numpy as np
import pandas as pd

from batchlab.steptime.kernel_profiles import MAX_TOKENS, PROJECTION_COLUMNS, SMALL_OP_COLUMNS, \
    compare_profile, error_summary, layer_shape_of, measured_layer_ms
from batchlab.steptime.kernels import KernelEfficiency, KernelModel
from batchlab.shapes import SMALL_OPS_PER_LAYER

MEMORY_BOUND_TOKENS = 8
P_RANGE = (1.0, 4.0)
COMPUTE_RANGE = (0.2, 1.0)
# (rows, columns) of a matrix multiply's output tile: tokens x output features. The width is
# stated: 128, the common CTA tile width of CUTLASS's and cuBLAS's bf16 kernels on Ampere and Hopper
# (an assumption; CUTLASS's SM80 default is 128 x 256, with 64 x 64 warp tiles). The height, 64 or
# 128 tokens (both common), is fitted: the one with the least error over the device's files.
TILE_COLS = 128
TILE_CANDIDATES = ((64, TILE_COLS), (128, TILE_COLS))


def _weighted_line(columns: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares of ``columns @ x ~ y`` in relative error (each row weighted by 1 / y)."""
    w = 1.0 / y
    return np.linalg.lstsq(columns * w[:, None], y * w, rcond=None)[0]


def _rows(tables: Mapping[str, pd.DataFrame]):
    """Each table's layer shape with its rows' tokens and tensor-parallel degrees."""
    for name, table in tables.items():
        yield name, table, layer_shape_of(table), table["num_tokens"].to_numpy(float), \
            table["tensor_parallel"].to_numpy(int)


def _fit_small_ops(tables, bandwidth: float, dtype_bytes: int) -> tuple[float, float]:
    """(latency s, bandwidth fraction) of the element-wise operators."""
    cols, ys = [], []
    for _, table, layer, tokens, tps in _rows(tables):
        elements = np.array([layer.small_op_elements(int(tp)) for tp in tps]) * tokens
        cols.append(np.c_[np.full(len(table), SMALL_OPS_PER_LAYER),
                          dtype_bytes * elements / bandwidth])
        ys.append(table[list(SMALL_OP_COLUMNS)].sum(axis=1).to_numpy() * 1e-3)
    latency, inverse = _weighted_line(np.vstack(cols), np.concatenate(ys))
    return float(latency), float(1.0 / inverse)


def _fit_memory_bound(tables, bandwidth: float, dtype_bytes: int) -> tuple[float, float]:
    """(latency s per matrix multiply, bandwidth fraction) from the memory-bound rows."""
    cols, ys = [], []
    for _, table, layer, tokens, tps in _rows(tables):
        keep = tokens <= MEMORY_BOUND_TOKENS
        moved = [sum(dtype_bytes * (k * n + t * (k + n)) for k, n in layer.projections(int(tp)))
                 for t, tp in zip(tokens[keep], tps[keep])]
        cols.append(np.c_[np.full(keep.sum(), 4.0), np.array(moved) / bandwidth])
        ys.append(table.loc[keep, list(PROJECTION_COLUMNS)].sum(axis=1).to_numpy() * 1e-3)
    latency, inverse = _weighted_line(np.vstack(cols), np.concatenate(ys))
    return float(latency), float(1.0 / inverse)


def _grid_minimum(f: Callable[[float, float], float], box: list[tuple[float, float]],
                  steps: int = 21, rounds: int = 5) -> tuple[float, float]:
    """The minimum of ``f`` over a box, on a grid refined ``rounds`` times around the best point."""
    lo, hi = np.array([b[0] for b in box]), np.array([b[1] for b in box])
    bounds_lo, bounds_hi = lo.copy(), hi.copy()
    best = (lo + hi) / 2
    for _ in range(rounds):
        xs, ys = (np.unique(np.linspace(lo[0], hi[0], steps)),
                  np.unique(np.linspace(lo[1], hi[1], steps)))
        values = np.array([[f(x, y) for y in ys] for x in xs])
        i, j = np.unravel_index(np.argmin(values), values.shape)
        best = np.array([xs[i], ys[j]])
        span = (hi - lo) / (steps - 1) * 2
        lo, hi = np.maximum(bounds_lo, best - span), np.minimum(bounds_hi, best + span)
    return float(best[0]), float(best[1])


def _log_error(tables,
               make: Callable[[float, float], KernelModel]) -> Callable[[float, float], float]:
    measured = {name: np.log(measured_layer_ms(t).to_numpy()) for name, t in tables.items()}

    def f(compute_fraction: float, p: float) -> float:
        kernels, total, count = make(compute_fraction, p), 0.0, 0
        for name, table, layer, tokens, tps in _rows(tables):
            for tp in np.unique(tps):
                rows = tps == tp
                predicted = kernels.layer_seconds(layer, tokens[rows], int(tp)) * 1e3
                total += float(np.sum((np.log(predicted) - measured[name][rows]) ** 2))
                count += int(rows.sum())
        return total / count
    return f


def _fit_compute(tables, make: Callable[..., KernelModel], transition_p: float | None,
                 tiles: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], float, float]:
    """(tile, compute fraction, p) with the least squared log error over the tiles given."""
    p_box = P_RANGE if transition_p is None else (transition_p, transition_p)
    best = None
    for tile in tiles:
        f = _log_error(tables, partial(make, tile))
        compute_fraction, p = _grid_minimum(f, [COMPUTE_RANGE, p_box])
        error = f(compute_fraction, p)
        if best is None or error < best[0]:
            best = (error, tile, compute_fraction, p)
    return best[1], best[2], best[3]


def fit_device(tables: Mapping[str, pd.DataFrame], bandwidth: float, peak: float,
               dtype_bytes: int = 2, transition_p: float | None = None, num_sms: int | None = None,
               tile: tuple[int, int] | None = None) -> tuple[KernelEfficiency, dict]:
    """The efficiency fitted to one device's profiles (file name -> table) on its datasheet
    (bandwidth, peak, ``num_sms``) and, per file, its ``{"rows", "median_error", "worst_error"}``
    over 1-4,096 tokens. ``tile`` (rows, columns) fixes the output tile instead of fitting it."""
    tables = {name: table[table["num_tokens"] <= MAX_TOKENS] for name, table in tables.items()}
    small_latency, small_fraction = _fit_small_ops(tables, bandwidth, dtype_bytes)
    latency, bandwidth_fraction = _fit_memory_bound(tables, bandwidth, dtype_bytes)

    def make(tile: tuple[int, int], compute_fraction: float, p: float) -> KernelModel:
        eff = KernelEfficiency(min(bandwidth_fraction, 1.0), compute_fraction, p, max(latency, 0.0),
                               min(small_fraction, 1.0), max(small_latency, 0.0), *tile)
        return KernelModel(bandwidth, peak, dtype_bytes, eff, num_sms)

    kernels = make(*_fit_compute(tables, make, transition_p,
                                 TILE_CANDIDATES if tile is None else [tile]))
    stats = {}
    for name, table in tables.items():
        compared = compare_profile(table, kernels)
        median, worst = error_summary(compared)
        stats[name] = {"rows": int(len(compared)), "median_error": median, "worst_error": worst}
    return kernels.efficiency, stats
