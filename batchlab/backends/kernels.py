"""What a GPU's kernels reach: one kernel's time from its bytes and FLOPs, fitted to measured ones.

A datasheet's roofline says a kernel takes ``max(bytes / bandwidth, flops / peak)``. Measured
kernels (``data/gpu_kernels/``: Vidur's per-layer operator times on an A100 and an H100) are
slower everywhere, and most of all near the ridge, where neither roof binds alone. Each kernel
here takes::

    t = latency + (a**p + c**p) ** (1/p)
    a = bytes / (bandwidth_fraction * bandwidth)         # the memory roof the kernels reach
    c = flops / (compute_fraction * peak)                # the compute roof they reach

``latency`` is a fixed cost per kernel (launch, ramp-up, the tail of the last wave), which is
what makes small matrices (a layer split over 8 GPUs) relatively slow. ``p`` shapes the
transition: ``p = 1`` adds the two times (no overlap at all), a large ``p`` tends to the hard
``max``. The small element-wise operators (norms, rope, the MLP's activation, the residual add)
get their own latency and bandwidth fraction and no compute term: they move bytes.

``KernelEfficiency`` holds the six fitted numbers (``scripts/fit_gpu_presets.py`` fits them,
``batchlab/backends/device_presets.json`` stores them per device); ``KernelModel`` applies them to
a device's datasheet numbers, for one kernel, one matrix multiply or one decoder layer. Every
method takes numpy arrays of token counts too (the fit evaluates thousands of rows at once).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from batchlab.checks import check_int, check_number
from batchlab.shapes import SMALL_OPS_PER_LAYER, LayerShape


def check_fraction(name: str, value: object) -> None:
    """``value`` is a finite number in (0, 1]."""
    check_number(name, value, 0.0, strict=True, hint="a fraction of the datasheet's figure")
    if value > 1:
        raise ValueError(f"{name}={value!r}; must be a finite number in (0, 1] (a fraction of the "
                         "datasheet's figure)")


@dataclass(frozen=True)
class KernelEfficiency:
    """A device's kernels as fractions of its datasheet, with the transition and fixed costs."""

    bandwidth_fraction: float            # of the datasheet bandwidth, matrix multiplies (and attention)
    compute_fraction: float              # of the datasheet dense peak
    transition_p: float                  # the smooth maximum's exponent, >= 1
    matmul_latency_s: float              # fixed seconds per matrix-multiply (or attention) kernel
    small_op_bandwidth_fraction: float   # of the datasheet bandwidth, element-wise operators
    small_op_latency_s: float            # fixed seconds per element-wise kernel

    def __post_init__(self) -> None:
        for name in ("bandwidth_fraction", "compute_fraction", "small_op_bandwidth_fraction"):
            check_fraction(name, getattr(self, name))
        check_number("transition_p", self.transition_p, 1.0)
        check_number("matmul_latency_s", self.matmul_latency_s)
        check_number("small_op_latency_s", self.small_op_latency_s)


@dataclass(frozen=True)
class KernelModel:
    """``KernelEfficiency`` applied to a device's datasheet bandwidth (bytes/s) and peak (FLOP/s)."""

    bandwidth_Bps: float
    peak_flops: float
    dtype_bytes: int
    efficiency: KernelEfficiency

    def __post_init__(self) -> None:
        check_number("bandwidth_Bps", self.bandwidth_Bps, strict=True)
        check_number("peak_flops", self.peak_flops, strict=True)
        check_int("dtype_bytes", self.dtype_bytes)
        if not isinstance(self.efficiency, KernelEfficiency):
            raise ValueError(f"efficiency={self.efficiency!r}; must be a KernelEfficiency")

    def kernel_seconds(self, num_bytes, flops):
        """One kernel that moves ``num_bytes`` and does ``flops``."""
        e = self.efficiency
        memory = num_bytes / (e.bandwidth_fraction * self.bandwidth_Bps)
        compute = flops / (e.compute_fraction * self.peak_flops)
        p = e.transition_p
        return e.matmul_latency_s + (memory**p + compute**p) ** (1.0 / p)

    def matmul_seconds(self, k: int, n: int, rows):
        """``rows`` x ``k`` activations times a ``k`` x ``n`` weight: the weight, input and output
        move once; 2 FLOPs per multiply-add."""
        num_bytes = self.dtype_bytes * (k * n + rows * (k + n))
        return self.kernel_seconds(num_bytes, 2.0 * k * n * rows)

    def small_ops_seconds(self, num_ops: int, elements):
        """``num_ops`` element-wise kernels moving ``elements`` values between them."""
        e = self.efficiency
        return (num_ops * e.small_op_latency_s
                + self.dtype_bytes * elements / (e.small_op_bandwidth_fraction * self.bandwidth_Bps))

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
