"""Device profiles measured elsewhere and stored with the course: ``data/device_profiles/*.json``.

``scripts/profile_device.py`` (run by ``scripts/gpu_check.sh`` on a GPU) measures a device's roofs
and its step profile and saves them there, named after the device. Notebook 01 plots every stored
profile beside the one it measures live, so a reader on a CPU sees what a GPU measured, labelled
with the device it came from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

import batchlab

PROFILES_DIR = Path(batchlab.__file__).resolve().parents[1] / "data" / "device_profiles"


@dataclass(frozen=True)
class StoredProfile:
    """One stored measurement: which device, in which dtype, when, and its decode steps."""

    device: str
    dtype: str
    measured_at: str
    bandwidth_Bps: float
    peak_flops: float
    decode: pd.DataFrame        # kind == "decode" rows of the profile: batch_size, ms_per_step, ...
    path: Path

    @property
    def label(self) -> str:
        return f"{self.device} ({self.dtype}, stored {self.measured_at[:10]})"


def load_device_profiles(folder: str | Path = PROFILES_DIR) -> list[StoredProfile]:
    """Every profile in ``folder`` (none if it does not exist), sorted by device name."""
    profiles = []
    for path in sorted(Path(folder).glob("*.json")):
        data = json.loads(path.read_text())
        try:
            steps = pd.DataFrame(data["profile"])
            decode = (steps[steps["kind"] == "decode"].sort_values("batch_size")
                      .reset_index(drop=True))
            profiles.append(StoredProfile(data["device"], data["dtype"], data["measured_at"],
                                          float(data["bandwidth_Bps"]), float(data["peak_flops"]),
                                          decode, path))
        except KeyError as missing:
            raise ValueError(f"{path}: not a device profile (no {missing} field); "
                             "make one with scripts/profile_device.py") from None
    return profiles
