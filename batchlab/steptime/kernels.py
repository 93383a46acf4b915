"""What a GPU's kernels reach: one kernel's time from its bytes and FLOPs, fitted to measured ones.

The rules and their reasons: ``docs/step-time-models.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from batchlab.checks import check_int, check_number
from batchlab.shapes import SMALL_OPS_PER_LAYER, LayerShape

# rows of the smallest bf16 tensor-core MMA (mma.sync m16n8k16, sm_80 on; PTX ISA)
MMA_ROWS = 16
# assumption: a split-K slice keeps at least 256 of K (four 64-deep K steps)
SPLIT_K_MIN_DEPTH = 256
SPLIT_K_MAX_SLICES = 16     # assumption: K is split into at most 16 slices


def split_k_slices(k: int) -> int:
    """How many slices the K loop of a ``k``-deep multiply may be split into (1 = no split)."""
    return max(1, min(SPLIT_K_MAX_SLICES, k // SPLIT_K_MIN_DEPTH))


def tile_height(rows, tile_rows: int):
    """The height of the tiles ``rows`` rows run in: ``tile_rows``, or for fewer rows the next
    power of two (at least ``MMA_ROWS``, at most ``tile_rows``)."""
    rows = np.asarray(rows, dtype=float)
    short = 2.0 ** np.ceil(np.log2(np.maximum(rows, 1.0)))
    return np.minimum(tile_rows, np.maximum(MMA_ROWS, short))


def wave_tiles(tiles, num_sms: int, k: int):
    """The tiles' time in tiles: whole waves of ``num_sms``, with the K loop split into the
    ``s <= split_k_slices(k)`` slices that round up least (``s`` slices make ``s`` times the
    tiles, each ``1/s`` as long)."""
    tiles = np.asarray(tiles, dtype=float)
    # every split at once, on a last axis
    s = np.arange(1, split_k_slices(k) + 1, dtype=float)
    return (np.ceil(tiles[..., None] * s / num_sms) * num_sms / s).min(axis=-1)


def check_fraction(name: str, value: object) -> None:
    """``value`` is a finite number in (0, 1]."""
    check_number(name, value, 0.0, strict=True, hint="a fraction of the datasheet's figure")
    if value > 1:
        raise ValueError(f"{name}={value!r}; must be a finite number in (0, 1] (a fraction of the "
                         "datasheet's figure)")


@dataclass(frozen=True)
class KernelEfficiency:
    """A device's kernels as fractions of its datasheet, with the transition and fixed costs."""

    # of the datasheet bandwidth, matrix multiplies (and attention)
    bandwidth_fraction: float
    compute_fraction: float              # of the datasheet dense peak
    transition_p: float                  # the smooth maximum's exponent, >= 1
    matmul_latency_s: float              # fixed seconds per matrix-multiply (or attention) kernel
    small_op_bandwidth_fraction: float   # of the datasheet bandwidth, element-wise operators
    small_op_latency_s: float            # fixed seconds per element-wise kernel
    # rows (tokens) of a matrix multiply's output tile; 1: unquantized
    tile_rows: int = 1
    tile_cols: int = 1                   # columns (output features) of the tile; 1: unquantized

    def __post_init__(self) -> None:
        for name in ("bandwidth_fraction", "compute_fraction", "small_op_bandwidth_fraction"):
            check_fraction(name, getattr(self, name))
        check_number("transition_p", self.transition_p, 1.0)
        check_number("matmul_latency_s", self.matmul_latency_s)
        check_number("small_op_latency_s", self.small_op_latency_s)
        check_int("tile_rows", self.tile_rows)
        check_int("tile_cols", self.tile_cols)


@dataclass(frozen=True)
class KernelModel:
    """``KernelEfficiency`` applied to a device's datasheet bandwidth (bytes/s), peak (FLOP/s) and
    SM count (``num_sms``; None: tiles are not rounded up to whole waves)."""

    bandwidth_Bps: float
    peak_flops: float
    dtype_bytes: int
    efficiency: KernelEfficiency
    num_sms: int | None = None

    def __post_init__(self) -> None:
        check_number("bandwidth_Bps", self.bandwidth_Bps, strict=True)
        check_number("peak_flops", self.peak_flops, strict=True)
        check_int("dtype_bytes", self.dtype_bytes)
        check_int("num_sms", self.num_sms, allow_none=True)
        if not isinstance(self.efficiency, KernelEfficiency):
            raise ValueError(f"efficiency={self.efficiency!r}; must be a KernelEfficiency")

    def kernel_seconds(self, num_bytes, flops):
        """One kernel that moves ``num_bytes`` and does ``flops``."""
        e = self.efficiency
        memory = num_bytes / (e.bandwidth_fraction * self.bandwidth_Bps)
        compute = flops / (e.compute_fraction * self.peak_flops)
        p = e.transition_p
        return e.matmul_latency_s + (memory**p + compute**p) ** (1.0 / p)

    def tiled_outputs(self, k: int, n: int, rows):
        """The outputs the tiles of a ``rows`` x ``n`` result compute, padding and the last wave's
        idle SMs counted (the module docstring's formula)."""
        e = self.efficiency
        height = tile_height(rows, e.tile_rows)
        tiles = np.ceil(np.asarray(rows, dtype=float) / height) * math.ceil(n / e.tile_cols)
        if self.num_sms is not None:
            tiles = wave_tiles(tiles, self.num_sms, k)
        return tiles * height * e.tile_cols

    def matmul_seconds(self, k: int, n: int, rows):
        """``rows`` x ``k`` activations times a ``k`` x ``n`` weight: the weight, input and output
        move once; 2 FLOPs per multiply-add of the tiles (``tiled_outputs``)."""
        num_bytes = self.dtype_bytes * (k * n + rows * (k + n))
        return self.kernel_seconds(num_bytes, 2.0 * k * self.tiled_outputs(k, n, rows))

    def small_ops_seconds(self, num_ops: int, elements):
        """``num_ops`` element-wise kernels moving ``elements`` values between them."""
        e = self.efficiency
        return (num_ops * e.small_op_latency_s
                + self.dtype_bytes * elements / (e.small_op_bandwidth_fraction
                                                 * self.bandwidth_Bps))

    def projections_seconds(self, layer: LayerShape, tokens, tensor_parallel: int = 1):
        """The layer's four matrix multiplies on one of ``tensor_parallel`` GPUs."""
        return sum(self.matmul_seconds(k, n, tokens) for k, n in layer.projections(tensor_parallel))

    def layer_small_ops_seconds(self, layer: LayerShape, tokens, tensor_parallel: int = 1):
        """The layer's small operators (two norms, rope, activation, residual add) on one GPU."""
        elements = np.multiply(tokens, layer.small_op_elements(tensor_parallel))
        return self.small_ops_seconds(SMALL_OPS_PER_LAYER, elements)

    def layer_seconds(self, layer: LayerShape, tokens, tensor_parallel: int = 1):
        """One decoder layer without its attention: projections and small operators."""
        return (self.projections_seconds(layer, tokens, tensor_parallel)
                + self.layer_small_ops_seconds(layer, tokens, tensor_parallel))
