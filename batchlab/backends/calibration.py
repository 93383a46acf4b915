"""Calibrating the simulator: measure real steps of the model, fit the cost model to them.

The simulator is only as good as its step-time formula. ``calibrate_cost_model`` serves a short,
deliberately varied workload on the real model (continuous batching with a small token budget,
so steps mix prompt chunks of many sizes with decode batches of many sizes and contexts) and
fits ``CostModel`` to the measured step durations. It takes some seconds on a CPU and adapts
to whatever machine runs it: on a GPU the fitted costs are a GPU's.
"""

from __future__ import annotations

import warnings

from batchlab.backends.cost_model import CostModel
from batchlab.backends.model_backend import ModelBackend
from batchlab.engine import Engine
from batchlab.schedulers import ContinuousBatcher
from batchlab.trace import StepRecord, Trace
from batchlab.workloads import make_workload


# Median relative error of a fit above which calibration warns (quiet CPUs here give 5-10%).
POOR_FIT_ERROR = 0.15


def calibration_workload(tokenizer, num_requests: int = 24, seed: int = 0):
    """Chat-like requests, all arriving at once, with prompts and outputs of many lengths."""
    return make_workload(num_requests, "chat", scale="cpu", arrival="at_once", seed=seed,
                         tokenizer=tokenizer, id_prefix="cal")


def calibration_trace(backend: ModelBackend, num_requests: int = 24, max_num_seqs: int = 16,
                      max_num_batched_tokens: int = 96, seed: int = 0, progress: bool = False) -> Trace:
    """Serve the calibration workload on the real model and return its trace (measured steps)."""
    requests = calibration_workload(backend.lm.tokenizer, num_requests, seed)
    scheduler = ContinuousBatcher(max_num_seqs=min(max_num_seqs, backend.kv.num_slots),
                                  max_num_batched_tokens=max_num_batched_tokens, chunked_prefill=True)
    return Engine(scheduler, backend).run(requests, progress=progress)


def calibrate_cost_model(backend: ModelBackend, num_requests: int = 24, seed: int = 0,
                         progress: bool = False) -> CostModel:
    """Fit the simulator's cost model to real steps measured on ``backend``'s model and device.

    Two passes with different token budgets (a small one for many small mixed steps, a large one
    for whole prompts at once) give the fit a wide range of step shapes.
    """
    return fit_calibration(backend, calibration_steps(backend, num_requests, seed, progress))


def calibration_steps(backend: ModelBackend, num_requests: int = 24, seed: int = 0,
                      progress: bool = False) -> list[StepRecord]:
    """The measured steps ``calibrate_cost_model`` fits: both passes, without warm-up steps."""
    steps: list[StepRecord] = []
    for budget, seqs in ((64, 16), (512, 8)):
        trace = calibration_trace(backend, num_requests, max_num_seqs=seqs,
                                  max_num_batched_tokens=budget, seed=seed, progress=progress)
        steps += trace.steps[1:]  # the first step warms caches up; leave it out
    return steps


def fit_calibration(backend: ModelBackend, steps: list[StepRecord]) -> CostModel:
    """Fit the cost model to calibration steps measured on ``backend`` (e.g. several rounds of
    ``calibration_steps`` pooled, to average over a machine whose speed drifts)."""
    lm = backend.lm
    cost = CostModel.fit(steps, source=f"{lm.name} on {lm.device} ({lm.dtype}), {len(steps)} steps")
    warn_if_poor_fit(cost)
    return cost


def warn_if_poor_fit(cost: CostModel) -> bool:
    """Warn (``RuntimeWarning``) and return True when a fit misses its own steps by more than
    ``POOR_FIT_ERROR`` (median relative error): the steps were probably timed on a busy CPU."""
    error = (cost.fit_stats or {}).get("median_rel_error")
    if error is None or error <= POOR_FIT_ERROR:
        return False
    warnings.warn(f"the cost model misses its own measured steps by {error:.0%} (median); on a quiet "
                  f"machine it is under {POOR_FIT_ERROR:.0%}. Something else was probably using the "
                  "CPU during calibration, so simulated latencies will be off: calibrate again when "
                  "the machine is quiet.", RuntimeWarning, stacklevel=2)
    return True
