"""What an all-reduce among tensor-parallel GPUs costs, fitted to measured NCCL times.

The rules and their reasons: ``docs/step-time-models.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from batchlab.checks import check_int, check_number

COLLECTIVES_PATH = Path(__file__).resolve().parent / "collectives.json"     # package data
TIME_COLUMN = "time_stats.all_reduce.median"
# Which measured node stands for each preset: an H200 SXM sits in the same NVLink 4 / NVSwitch
# node as an H100 SXM (an assumption: same links, more memory). L4 and T4 are PCIe cards: no
# all-reduce of theirs was measured.
NODE_OF = {"H100": "h100_dgx", "H200": "h100_dgx", "A100": "a100_dgx"}


@dataclass(frozen=True)
class AllReduceModel:
    """One all-reduce among ``num_gpus`` GPUs:
    ``latency_s + bytes * 2 (n-1)/n / bus_bandwidth_Bps``."""

    num_gpus: int
    latency_s: float
    bus_bandwidth_Bps: float
    small_bytes: tuple[float, ...] = ()      # vLLM's custom all-reduce: measured sizes ...
    small_seconds: tuple[float, ...] = ()    # ... and times, used up to small_max_bytes
    small_max_bytes: float = 0.0

    def __post_init__(self) -> None:
        check_int("num_gpus", self.num_gpus, minimum=2)
        check_number("latency_s", self.latency_s)
        check_number("bus_bandwidth_Bps", self.bus_bandwidth_Bps, strict=True)
        if (len(self.small_bytes) != len(self.small_seconds)
                or (self.small_bytes and len(self.small_bytes) < 2)):
            raise ValueError(f"small_bytes={self.small_bytes!r}; must pair with small_seconds, "
                             "two points or more")

    def nccl_seconds(self, num_bytes):
        n = self.num_gpus
        return self.latency_s + np.multiply(num_bytes, 2 * (n - 1) / n) / self.bus_bandwidth_Bps

    def __call__(self, num_bytes):
        if not self.small_bytes:
            return self.nccl_seconds(num_bytes)
        x, y = np.asarray(self.small_bytes), np.asarray(self.small_seconds)
        slope = (y[-1] - y[-2]) / (x[-1] - x[-2])          # past the last measured size: its slope
        small = np.where(np.less_equal(num_bytes, x[-1]), np.interp(num_bytes, x, y),
                         y[-1] + slope * (np.asarray(num_bytes, dtype=float) - x[-1]))
        return np.where(np.less(num_bytes, self.small_max_bytes), small,
                        self.nccl_seconds(num_bytes))


def fit_all_reduce(table: pd.DataFrame, num_gpus: int) -> tuple[AllReduceModel, dict]:
    """The model fitted to the rows of ``num_gpus`` GPUs in one node type's table (least squares
    in relative error), with ``{"rows", "median_error", "worst_error"}``."""
    rows = table[table["num_workers"] == num_gpus]
    if rows.empty:
        raise ValueError(f"num_gpus={num_gpus}; must be one of "
                         f"{sorted(table['num_workers'].unique())} (the GPU counts measured)")
    size = rows["size"].to_numpy(float)
    seconds = rows[TIME_COLUMN].to_numpy(float) * 1e-3
    moved = size * 2 * (num_gpus - 1) / num_gpus
    w = 1.0 / seconds
    (latency, inverse), *_ = np.linalg.lstsq(np.c_[np.ones_like(moved), moved] * w[:, None],
                                             seconds * w, rcond=None)
    model = AllReduceModel(num_gpus, max(float(latency), 0.0), 1.0 / float(inverse))
    errors = np.abs(model(size) / seconds - 1)
    return model, {"rows": int(len(rows)), "median_error": float(np.median(errors)),
                   "worst_error": float(errors.max())}


def load_collectives(path: str | Path = COLLECTIVES_PATH) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def all_reduce_model(device: str, num_gpus: int,
                     path: str | Path = COLLECTIVES_PATH) -> AllReduceModel:
    """The stored fit for ``num_gpus`` GPUs of preset ``device`` in one node."""
    check_int("num_gpus", num_gpus, minimum=2)
    if device not in NODE_OF:
        raise ValueError(f"device={device!r}; tensor parallelism needs a measured all-reduce: "
                         f"one of {sorted(NODE_OF)} "
                         f"(no all-reduce of a {device} node is in data/gpu_network/)")
    data = load_collectives(path)
    fits = data["nodes"][NODE_OF[device]]
    if str(num_gpus) not in fits:
        raise ValueError(f"tensor_parallel={num_gpus}; must be one of {sorted(map(int, fits))} "
                         f"on {device} (the GPU counts measured in one node)")
    entry = fits[str(num_gpus)]
    custom = data.get("custom", {}).get(NODE_OF[device])
    small = {}
    if custom is not None and str(num_gpus) in custom["us"]:
        small = {"small_bytes": tuple(custom["bytes"]),
                 "small_max_bytes": float(custom["max_bytes"]),
                 "small_seconds": tuple(us * 1e-6 for us in custom["us"][str(num_gpus)])}
    return AllReduceModel(num_gpus, entry["latency_us"] * 1e-6, entry["bus_bandwidth_GBps"] * 1e9,
                          **small)


__all__ = ["COLLECTIVES_PATH", "NODE_OF", "AllReduceModel", "all_reduce_model", "fit_all_reduce",
           "load_collectives"]
