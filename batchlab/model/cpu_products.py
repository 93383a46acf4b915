"""How the step multiplies activations by weights on a CPU: the routes, in one place.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import torch

PREPACK = True     # set to False to compare (the packed copies cost a second copy of the weights)
PACK_ROWS = 32     # the row count oneDNN is told to expect (best of 1, 32, 512 measured there)
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
# oneDNN's instruction-set levels (dnnl_cpu_isa_t: each a bit mask that holds the ones below it).
# ``ONEDNN_MAX_CPU_ISA`` caps the kernels oneDNN may run, which is how a CPU with bf16 units can
# run the kernels of CPUs without them; a bf16 flag counts only when its level is under the cap.
ONEDNN_ISA_LEVELS = {"SSE41": 0x1, "AVX": 0x3, "AVX2": 0x7, "AVX2_VNNI": 0xF, "AVX2_VNNI_2": 0x1F,
                     "AVX512_CORE": 0x27, "AVX512_CORE_VNNI": 0x67, "AVX512_CORE_BF16": 0xE7,
                     "AVX10_1_512": 0x1EF, "AVX512_CORE_FP16": 0x1EF, "AVX10_1_512_AMX": 0xFEF,
                     "AVX512_CORE_AMX": 0xFEF, "AVX10_1_512_AMX_FP16": 0x1FEF,
                     "AVX512_CORE_AMX_FP16": 0x1FEF}
BF16_FLAG_LEVEL = {"avx512_bf16": "AVX512_CORE_BF16", "amx_bf16": "AVX512_CORE_AMX"}


def onednn_isa_cap() -> str | None:
    """The instruction-set level oneDNN is capped at (``ONEDNN_MAX_CPU_ISA``, or its older name
    ``DNNL_MAX_CPU_ISA``), upper-cased; None when unset, ``ALL``/``DEFAULT`` or not a known
    level."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    return cap if cap in ONEDNN_ISA_LEVELS else None


def cpu_bf16_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> list[str]:
    """The bf16 matrix-unit flags this CPU reports and oneDNN may use (empty when none, or no
    /proc/cpuinfo): a flag above ``ONEDNN_MAX_CPU_ISA``'s level does not count."""
    try:
        with open(cpuinfo) as f:
            flags = next(line for line in f if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return []
    cap = onednn_isa_cap()
    allowed = ONEDNN_ISA_LEVELS[cap] if cap else None

    def usable(flag: str) -> bool:
        level = ONEDNN_ISA_LEVELS[BF16_FLAG_LEVEL[flag]]
        return allowed is None or level & allowed == level
    return sorted(f for f in flags if f in BF16_FLAGS and usable(f))


def widens_bf16(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether a bf16 product on ``device`` is computed in fp32 (a CPU without usable bf16
    units)."""
    return dtype == torch.bfloat16 and torch.device(device).type == "cpu" and not cpu_bf16_flags()


@lru_cache(maxsize=None)
def _bf16_units_under(cap: str | None) -> bool:
    return bool(cpu_bf16_flags())


def cpu_has_bf16_units() -> bool:
    """``cpu_bf16_flags()`` non-empty, read once per ``ONEDNN_MAX_CPU_ISA`` cap (the step's
    attention asks at every layer)."""
    return _bf16_units_under(onednn_isa_cap())


def prepack_available() -> bool:
    """Whether this torch build can pack weights for oneDNN (CPU builds with mkldnn)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                            "_reorder_linear_weight")


def min_pack_rows(dtype: torch.dtype) -> int:
    """From how many rows a product in ``dtype`` uses the packed copy (fp32 keeps ``x @ w`` at
    one)."""
    return 2 if dtype == torch.float32 else 1


def uses_packing(dtype: torch.dtype, device: torch.device | str, widen_bf16: bool) -> bool:
    """Whether the step packs its weights for this dtype and device (fp32, or bf16 on bf16
    units)."""
    packable = dtype == torch.float32 or (dtype == torch.bfloat16 and not widen_bf16)
    return PREPACK and packable and torch.device(device).type == "cpu" and prepack_available()


def prepack(w: torch.Tensor) -> torch.Tensor:
    """oneDNN's packed copy of an (in, out) weight, made from its (out, in) layout."""
    return torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous(), PACK_ROWS)


def packed_product(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """``x @ w`` for a (rows, in) activation, with ``packed = prepack(w)``: (rows, out)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


class StepProducts:
    """``x @ w`` for a model's (in, out) weights, each by the step's route on their dtype and
    device: the weight's packed copy from ``min_rows`` rows on, else a plain matmul; bf16 on a CPU
    without bf16 units (``widen``) takes fp32's route on an fp32 copy of each weight and rounds
    the result back. The copies are made here, once."""

    def __init__(self, weights: list[torch.Tensor], dtype: torch.dtype,
                 device: torch.device | str) -> None:
        self.weights = weights                         # the (in, out) weights it multiplies by
        self.dtype, self.device = dtype, device
        self.widen = widens_bf16(dtype, device)

    @property
    def widen(self) -> bool:
        """Whether bf16 products are computed in fp32, on fp32 copies of the weights."""
        return self._widen

    @widen.setter
    def widen(self, widen: bool) -> None:
        self._widen = widen
        # id(weight) -> its fp32 copy (same values: bf16 widens to fp32 exactly), while ``widen``
        self.widened: dict[int, torch.Tensor] = ({id(w): w.float() for w in self.weights}
                                                 if widen else {})
        route = torch.float32 if widen else self.dtype
        self.min_rows = min_pack_rows(route)
        # id(weight) -> the packed copy of what it multiplies by (empty where the step does not
        # pack; oneDNN packs bf16 only for a CPU with bf16 units)
        emulated = route == torch.bfloat16 and widens_bf16(self.dtype, self.device)
        self.packed: dict[int, torch.Tensor] = (
            {id(w): prepack(self.widened.get(id(w), w)) for w in self.weights}
            if uses_packing(route, self.device, widen_bf16=emulated) else {})

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """(rows, in) activation times one of the (in, out) weights: (rows, out)."""
        if self.widen:
            return self._product(x.float(), self.widened[id(w)], id(w)).to(x.dtype)   # rounded back
        return self._product(x, w, id(w))

    def _product(self, x: torch.Tensor, w: torch.Tensor, key: int) -> torch.Tensor:
        packed = self.packed.get(key)
        if packed is not None and x.shape[0] >= self.min_rows:
            return packed_product(x, packed)
        return x @ w
