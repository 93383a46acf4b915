"""GPU presets: each device's datasheet roofline and what its kernels were measured to reach.

The rules and their reasons: ``docs/step-time-models.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from batchlab.steptime.kernels import KernelEfficiency, KernelModel
from batchlab.checks import check_int, check_number
from batchlab.shapes import DTYPE_BYTES

DEVICE_PRESETS_PATH = Path(__file__).resolve().parent / "device_presets.json"   # package data
_PRESET_KEYS = {"memory_bandwidth_GBps", "peak_tflops", "dtype", "memory_GB", "num_sms", "source",
                "kernels"}
_FITTED_KEYS = {"bandwidth_fraction", "compute_fraction", "transition_p", "matmul_latency_us",
                "small_op_bandwidth_fraction", "small_op_latency_us", "tile_rows", "tile_cols",
                "source", "fit"}


@dataclass(frozen=True)
class DevicePreset:
    """A device's roofline (bandwidth in bytes/s, dense peak in FLOP/s in ``dtype``) and its
    kernels."""

    name: str
    memory_bandwidth_Bps: float
    peak_flops: float
    dtype: str
    memory_bytes: float
    source: str
    kernels: KernelEfficiency | None = None
    kernels_source: str = ""
    step_overhead_s: float = 0.0
    step_overhead_source: str = ""
    num_sms: int | None = None          # streaming multiprocessors; None: no wave quantization

    def __post_init__(self) -> None:
        hint = f"device preset {self.name!r}"
        for name in ("memory_bandwidth_Bps", "peak_flops", "memory_bytes"):
            check_number(name, getattr(self, name), strict=True, hint=hint)
        check_number("step_overhead_s", self.step_overhead_s, hint=hint)
        check_int("num_sms", self.num_sms, allow_none=True, hint=hint)
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype={self.dtype!r}; must be one of {sorted(DTYPE_BYTES)} ({hint})")
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(f"source={self.source!r}; must name the datasheet the numbers "
                             f"come from ({hint})")
        if self.kernels is not None and not self.kernels_source:
            raise ValueError(f"kernels_source={self.kernels_source!r}; must say where the kernels' "
                             f"efficiencies come from ({hint})")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def kernel_model(self) -> KernelModel:
        """This device's kernels on its datasheet's roofs and SMs."""
        if self.kernels is None:
            raise ValueError(f"kernels=None; must be set for device {self.name!r} "
                             "to model its kernels")
        return KernelModel(self.memory_bandwidth_Bps, self.peak_flops, self.dtype_bytes,
                           self.kernels, self.num_sms)


def _check_keys(where: str, entry: object, keys: set[str],
                optional: set[str] = frozenset()) -> None:
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be an object with keys {sorted(keys)}")
    missing, extra = keys - optional - entry.keys(), entry.keys() - keys
    if missing or extra:
        raise ValueError(f"{where} lacks {sorted(missing)} / has unknown {sorted(extra)}; "
                         f"the keys are {sorted(keys)}")


def _fitted_kernels(where: str, entry: dict) -> KernelEfficiency:
    """A fitted ``kernels`` entry (latencies in microseconds, as the fit script writes them)."""
    _check_keys(where, entry, _FITTED_KEYS, optional={"fit"})
    for key in ("matmul_latency_us", "small_op_latency_us"):
        check_number(key, entry[key], hint=where)
    return KernelEfficiency(entry["bandwidth_fraction"], entry["compute_fraction"],
                            entry["transition_p"],
                            entry["matmul_latency_us"] * 1e-6, entry["small_op_bandwidth_fraction"],
                            entry["small_op_latency_us"] * 1e-6, entry["tile_rows"],
                            entry["tile_cols"])


def _resolve_kernels(path, devices: dict) -> dict[str, tuple[KernelEfficiency, str]]:
    """Every device's kernels and their source; a ``like`` entry borrows a fitted device's."""
    def borrows(entry: dict) -> bool:
        return isinstance(entry["kernels"], dict) and "like" in entry["kernels"]

    fitted = {name: (_fitted_kernels(f"{path}: device {name!r} kernels", entry["kernels"]),
                     entry["kernels"]["source"])
              for name, entry in devices.items() if not borrows(entry)}
    resolved = {}
    for name, entry in devices.items():
        kernels = entry["kernels"]
        if borrows(entry):
            _check_keys(f"{path}: device {name!r} kernels", kernels, {"like", "source"})
            if kernels["like"] not in fitted:
                raise ValueError(f"like={kernels['like']!r}; must be a device with fitted "
                                 f"kernels, one of {sorted(fitted)} ({path}: device {name!r})")
            resolved[name] = (fitted[kernels["like"]][0], kernels["source"])
        else:
            resolved[name] = fitted[name]
    return resolved


def _step_overhead(path, data: dict) -> tuple[float, str]:
    entry = data.get("step_overhead")
    _check_keys(f"{path}: step_overhead", entry, {"ms", "source"})
    check_number("step_overhead.ms", entry["ms"], hint=str(path))
    return entry["ms"] * 1e-3, entry["source"]


def load_device_presets(path: str | Path = DEVICE_PRESETS_PATH) -> dict[str, DevicePreset]:
    """Read the presets file (GB/s, dense TFLOPS, GB, as datasheets state them) into
    ``DevicePreset``s."""
    data = json.loads(Path(path).read_text())
    devices = data.get("devices") if isinstance(data, dict) else None
    if not isinstance(devices, dict) or not devices:
        raise ValueError(f"{path}: expected an object with a non-empty 'devices' object")
    for name, entry in devices.items():
        _check_keys(f"{path}: device {name!r}", entry, _PRESET_KEYS)
        for key in ("memory_bandwidth_GBps", "peak_tflops", "memory_GB"):
            check_number(key, entry[key], strict=True, hint=f"{path}: device {name!r}")
        check_int("num_sms", entry["num_sms"], hint=f"{path}: device {name!r}")
    kernels = _resolve_kernels(path, devices)
    overhead_s, overhead_source = _step_overhead(path, data)
    return {name: DevicePreset(name, entry["memory_bandwidth_GBps"] * 1e9,
                               entry["peak_tflops"] * 1e12,
                               entry["dtype"], entry["memory_GB"] * 1e9, entry["source"],
                               *kernels[name], overhead_s, overhead_source, entry["num_sms"])
            for name, entry in devices.items()}


def device_preset(name: str, path: str | Path = DEVICE_PRESETS_PATH) -> DevicePreset:
    presets = load_device_presets(path)
    if name not in presets:
        raise ValueError(f"device={name!r}; must be one of {sorted(presets)}")
    return presets[name]
