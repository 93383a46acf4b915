"""Backends compute a step plan; the engine sees only ``Backend``.

- ``base``           the contract: ``run(plan) -> StepResult`` (tokens and the step's duration),
                     plus ``release``/``reset``/``describe`` hooks the engine calls
- ``model_backend``  the real SmolLM2 model, through ``batchlab.model``'s batched step

The simulator's backend (``SimBackend``: steps take the time a cost model predicts) lives with its
fast path in ``batchlab.sim``. ``ModelBackend`` is imported on first use, so importing this
package never loads torch.
"""

from __future__ import annotations

from batchlab.backends.base import Backend, StepResult
from batchlab.steptime.cost_model import CostModel

__all__ = ["Backend", "StepResult", "CostModel", "ModelBackend"]


def __getattr__(name: str):
    # Module-level __getattr__ (PEP 562): runs only for names not found above.
    if name == "ModelBackend":
        from batchlab.backends.model_backend import ModelBackend
        return ModelBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
