"""Calibrating the simulator: measure real steps of the model, fit the cost model to them.

The rules and their reasons: ``docs/step-time-models.md``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from batchlab.steptime.cost_model import CostModel, features_df
from batchlab.backends.model_backend import ModelBackend
from batchlab.engine import Engine
from batchlab.engine_args import EngineArgs
from batchlab.model.loading import cache_root
from batchlab.schedulers import ContinuousBatcher
from batchlab.schedulers.continuous import batcher_for
from batchlab.trace import StepRecord, Trace
from batchlab.workloads import make_workload


# Median relative error of a fit above which calibration warns (quiet CPUs here give 5-10%).
POOR_FIT_ERROR = 0.15
# A calibration pass's scheduler where calibration_trace's args leave a flag at None.
CALIBRATION_ARGS = EngineArgs(max_num_seqs=16, max_num_batched_tokens=96,
                              enable_chunked_prefill=True)
# Prompts served alone in the calibration's third pass (capped by the backend's slot length),
# each in one step; then one prompt served alone in chunks of each CHUNK_BUDGETS size.
LONE_PROMPT_LENS = (32, 64, 128, 256, 384)
CHUNKED_PROMPT_LEN, CHUNK_BUDGETS = 256, (32, 64)
# A stored fit is reused when it predicts fresh steps within this median relative error (quiet
# CPUs here: 4-8%; one busy core: 60-70%), and when it is at most REUSE_MAX_AGE_S old.
REUSE_ERROR, REUSE_MAX_AGE_S = 0.10, 6 * 3600
# The batch of decodes the check times (after its first, prefill step): sequences, prompt, output.
CHECK_BATCH = (16, 32, 6)
STORE_FORMAT = 1


def calibration_workload(tokenizer, num_requests: int = 24, seed: int = 0):
    """Chat-like requests, all arriving at once, with prompts and outputs of many lengths."""
    return make_workload(num_requests, "chat", scale="cpu", arrival="at_once", seed=seed,
                         tokenizer=tokenizer, id_prefix="cal")


def calibration_trace(backend: ModelBackend, num_requests: int = 24,
                      args: EngineArgs = CALIBRATION_ARGS,
                      seed: int = 0, progress: bool = False) -> Trace:
    """Serve the calibration workload on the real model and return its trace (measured steps),
    under vLLM's flags ``args`` (each left at None: ``CALIBRATION_ARGS``')."""
    requests = calibration_workload(backend.lm.tokenizer, num_requests, seed)
    # The KV space limits admission by itself (a slot cache: its slots), whatever its kind.
    scheduler = batcher_for(args.with_defaults(CALIBRATION_ARGS))
    return Engine(scheduler, backend).run(requests, progress=progress)


def calibrate_cost_model(backend: ModelBackend, num_requests: int = 24, seed: int = 0,
                         progress: bool = False, reuse: bool = False) -> CostModel:
    """Fit the simulator's cost model to real steps measured on ``backend``'s model and device.

    Two passes with different token budgets (a small one for many small mixed steps, a large one
    for whole prompts at once) and a pass of lone prompts of several lengths (one step each) give
    the fit a wide range of step shapes. The fit is stored for this machine and setup;
    ``reuse=True`` returns the stored one instead when fresh steps confirm it (module docstring).
    """
    store = stored_fit_path(backend, num_requests, seed)
    if reuse:
        cost = checked_stored_fit(backend, store, seed)
        if cost is not None:
            return cost
    cost = fit_calibration(backend, calibration_steps(backend, num_requests, seed, progress))
    write_stored_fit(store, cost, fit_setup(backend, num_requests, seed))
    return cost


def calibration_steps(backend: ModelBackend, num_requests: int = 24, seed: int = 0,
                      progress: bool = False) -> list[StepRecord]:
    """The measured steps ``calibrate_cost_model`` fits: both passes, without warm-up steps."""
    steps: list[StepRecord] = []
    for budget, seqs in ((64, 16), (512, 8)):
        trace = calibration_trace(backend, num_requests,
                                  EngineArgs(max_num_seqs=seqs, max_num_batched_tokens=budget),
                                  seed=seed, progress=progress)
        steps += trace.steps[1:]  # the first step warms caches up; leave it out
    return steps + lone_prompt_steps(backend, seed=seed)


def lone_prompt_steps(backend: ModelBackend, lengths: tuple[int, ...] = LONE_PROMPT_LENS,
                      seed: int = 0) -> list[StepRecord]:
    """Each prompt of ``lengths`` served alone and computed in one step, then one decode step; and
    a ``CHUNKED_PROMPT_LEN``-token prompt served alone in chunks of each ``CHUNK_BUDGETS`` size.
    The chunks hold the same number of tokens but ever more attention pairs (each reads all the
    keys before it), so they pin the per-pair cost apart from the per-token one (module
    docstring). Lengths that do not fit the backend's slots (prompt + 2 tokens) are left out."""
    max_len = backend.kv.max_seq_len or max(lengths) + 2
    runs = [(n, n) for n in lengths if n + 2 <= max_len]              # (prompt tokens, budget)
    chunked = min(CHUNKED_PROMPT_LEN, max_len - 2)
    runs += [(chunked, budget) for budget in CHUNK_BUDGETS if budget < chunked]
    steps: list[StepRecord] = []
    for i, (n, budget) in enumerate(runs):
        request = make_workload(1, prompt_len=n, output_len=2, arrival="at_once", seed=seed + i,
                                tokenizer=backend.lm.tokenizer, id_prefix=f"lone{n}-{budget}-")
        scheduler = ContinuousBatcher(max_num_seqs=1, max_num_batched_tokens=budget,
                                      chunked_prefill=True)
        steps += Engine(scheduler, backend).run(request).steps
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
    warnings.warn(f"the cost model misses its own measured steps by {error:.0%} (median); on a "
                  f"quiet machine it is under {POOR_FIT_ERROR:.0%}. Something else was probably "
                  "using the CPU during calibration, so simulated latencies will be off: "
                  "calibrate again when the machine is quiet.", RuntimeWarning, stacklevel=2)
    return True


# --- the stored fit ------------------------------------------------------------------------------
def fit_setup(backend: ModelBackend, num_requests: int = 24, seed: int = 0) -> dict:
    """Everything that changes a calibration's steps or their time: the machine, the library, the
    threads and oneDNN's cap, the model and its dtype, the KV cache and the calibration's own
    sizes."""
    kv = backend.kv
    return {"format": STORE_FORMAT, "host": platform.node(), "machine": platform.machine(),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
            "model": backend.lm.name, "device": str(backend.lm.device),
            "dtype": str(backend.lm.dtype),
            "kv": type(kv).__name__, **{name: getattr(kv, name, None) for name in
                                         ("num_slots", "num_blocks", "block_size", "max_seq_len")},
            "speculative": repr(backend.speculative), "num_requests": num_requests, "seed": seed,
            "lone_prompts": [LONE_PROMPT_LENS, CHUNKED_PROMPT_LEN, CHUNK_BUDGETS]}


def stored_fit_path(backend: ModelBackend, num_requests: int = 24, seed: int = 0) -> Path:
    """Where the fit for this machine and setup is stored: named by a hash of ``fit_setup`` (the
    file holds the setup too, in the clear)."""
    setup = json.dumps(fit_setup(backend, num_requests, seed), sort_keys=True)
    return cache_root() / "calibrations" / f"{hashlib.sha256(setup.encode()).hexdigest()[:16]}.json"


def write_stored_fit(path: Path, cost: CostModel, setup: dict | None = None) -> None:
    """Store ``cost`` (and the ``setup`` it was measured in) at ``path``, written whole and then
    renamed: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump({"stored_at": time.time(), "setup": setup, "cost_model": cost.to_dict()}, f,
                  indent=1)
    os.replace(tmp, path)


def check_steps(backend: ModelBackend, seed: int = 0) -> list[StepRecord]:
    """About 30 fresh steps to check a stored fit on: a batch of decodes (its first step, the
    prefill that warms the caches, left out), then the lone prompts."""
    num_seqs, prompt_len, output_len = CHECK_BATCH
    requests = make_workload(num_seqs, prompt_len=prompt_len, output_len=output_len,
                             arrival="at_once",
                             seed=seed, tokenizer=backend.lm.tokenizer, id_prefix="check")
    scheduler = ContinuousBatcher(max_num_seqs=num_seqs,
                                  max_num_batched_tokens=num_seqs * prompt_len)
    return (Engine(scheduler, backend).run(requests).steps[1:]
            + lone_prompt_steps(backend, seed=seed))


def fit_error(cost: CostModel, steps: list[StepRecord]) -> float:
    """Median relative error of ``cost``'s predictions for measured ``steps``."""
    table = features_df(steps)
    measured = table["duration"].to_numpy()
    return float(np.median(np.abs(cost.predict_df(table) / measured - 1)))


def checked_stored_fit(backend: ModelBackend, path: Path, seed: int = 0) -> CostModel | None:
    """The fit stored at ``path`` if it is recent and predicts fresh steps within ``REUSE_ERROR``
    (its ``fit_stats`` then record the check), else None."""
    try:
        stored = json.loads(path.read_text())
        cost, age = CostModel.from_dict(stored["cost_model"]), time.time() - stored["stored_at"]
    except (OSError, ValueError, KeyError, TypeError):
        return None                     # none stored, or damaged: calibrate anew (and store)
    if not 0 <= age <= REUSE_MAX_AGE_S:
        return None
    steps = check_steps(backend, seed)
    error = fit_error(cost, steps)
    if error > REUSE_ERROR:
        return None
    checked = {**(cost.fit_stats or {}), "checked_steps": len(steps), "checked_error": error,
               "stored_minutes_ago": age / 60}
    return dataclasses.replace(cost, fit_stats=checked)
