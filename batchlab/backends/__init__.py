"""Backends compute a step plan: the real model (``ModelBackend``) or the simulator (``SimBackend``).

- ``base``           the contract: ``run(plan) -> StepResult`` (tokens and the step's duration),
                     plus ``release``/``reset``/``describe`` hooks the engine calls
- ``model_backend``  the real SmolLM2 model, through ``batchlab.model``'s batched step
- ``simulator``      steps take the time a cost model predicts; nothing is computed

Why a folder: the engine sees only ``Backend``. How long a step takes, measured or predicted, is
``batchlab.steptime``'s job; the simulator asks it.
``ModelBackend`` is imported on first use (``from batchlab.backends import ModelBackend`` works),
so importing this package, or running the simulator, never loads torch.
"""

from __future__ import annotations

from batchlab.backends.base import Backend, StepResult
from batchlab.steptime.cost_model import CostModel
from batchlab.backends.simulator import PLACEHOLDER_TOKEN, SimBackend

__all__ = ["Backend", "StepResult", "SimBackend", "CostModel", "ModelBackend", "PLACEHOLDER_TOKEN"]


def __getattr__(name: str):
    # Module-level __getattr__ (PEP 562): runs only for names not found above.
    if name == "ModelBackend":
        from batchlab.backends.model_backend import ModelBackend
        return ModelBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
