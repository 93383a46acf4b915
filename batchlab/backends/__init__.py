"""Backends compute a step plan: the real model (``ModelBackend``) or the simulator (``SimBackend``).

- ``base``           the contract: ``run(plan) -> StepResult`` (tokens and the step's duration),
                     plus ``release``/``reset``/``describe`` hooks the engine calls
- ``model_backend``  the real SmolLM2 model, through ``batchlab.model``'s batched step
- ``simulator``      steps take the time a cost model predicts; nothing is computed
- ``cost_model``     the step-time formula and its fit to measured steps
- ``roofline``       the GPU step-time formula (datasheet roofline, or grounded in measured kernels)
- ``device_presets``, ``kernels``, ``grounded_step``  its pieces: GPU presets, one kernel's
                     time, a whole step summed kernel by kernel (models' shapes: ``batchlab.shapes``)
- ``kernel_profiles``, ``kernel_fit``  measured kernel times (``data/gpu_kernels/``) read, compared
                     with a preset, and fitted into one
- ``measured_kernels``, ``attention_fit``, ``measured_step``  vLLM's own kernels measured per GPU
                     and vLLM version (AIConfigurator's tables in ``aiconfigurator-core``), attention
                     fitted to them, and a step summed from them

Why a folder: the engine sees only ``Backend``; everything that decides *how long a step takes*
(measured or predicted) lives here. Calibration (measuring the real model to fit a cost model)
runs the engine, so it lives above it, in ``batchlab.experiments.calibration``; the simulator's
fast path lives with the serving loop (``batchlab.fast_path``).
``ModelBackend`` is imported on first use (``from batchlab.backends import ModelBackend`` works),
so importing this package, or running the simulator, never loads torch.
"""

from __future__ import annotations

from batchlab.backends.base import Backend, StepResult
from batchlab.backends.cost_model import CostModel
from batchlab.backends.simulator import PLACEHOLDER_TOKEN, SimBackend

__all__ = ["Backend", "StepResult", "SimBackend", "CostModel", "ModelBackend", "PLACEHOLDER_TOKEN"]


def __getattr__(name: str):
    # Module-level __getattr__ (PEP 562): runs only for names not found above.
    if name == "ModelBackend":
        from batchlab.backends.model_backend import ModelBackend
        return ModelBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
