"""Backends compute a step plan: the real model (``ModelBackend``) or the simulator (``SimBackend``).

``ModelBackend`` is imported on first use (``from batchlab.backends import ModelBackend`` works),
so importing this package, or running the simulator, never loads torch.
"""

from __future__ import annotations

from batchlab.backends.cost_model import CostModel
from batchlab.backends.base import Backend, StepResult
from batchlab.backends.simulator import PLACEHOLDER_TOKEN, SimBackend

__all__ = ["Backend", "StepResult", "SimBackend", "CostModel", "ModelBackend", "PLACEHOLDER_TOKEN"]


def __getattr__(name: str):
    # Module-level __getattr__ (PEP 562): runs only for names not found above.
    if name == "ModelBackend":
        from batchlab.backends.model_backend import ModelBackend
        return ModelBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
