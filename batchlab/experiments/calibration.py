"""Calibrating the simulator: measure real steps of the model, fit the cost model to them.

The simulator is only as good as its step-time formula. ``calibrate_cost_model`` serves a short,
deliberately varied workload on the real model (continuous batching with a small token budget,
so steps mix prompt chunks of many sizes with decode batches of many sizes and contexts) and
fits ``CostModel`` to the measured step durations. It takes some seconds on a CPU and adapts
to whatever machine runs it: on a GPU the fitted costs are a GPU's.

A third pass serves a few prompts alone (``LONE_PROMPT_LENS``), each computed in one step. The
two batched passes are mostly decode steps: of some 220 steps only a handful hold more than 64
tokens, and none holds one long prompt by itself. Fitted to those alone, the split between the
per-token and per-attention-pair costs is barely pinned down, and a lone 256-token prompt
(32,896 attention pairs, far beyond any calibrated step) was predicted anywhere from 0.55x to
1.6x its measured time from one calibration to the next on a busy single core. The notebooks
simulate exactly such steps (a dynamic batch's whole-prompt prefill), so the calibration
measures them. And since a chunk that starts at token ``s`` attends to the ``s`` keys before it
(through an explicit mask: another attention call than a whole prompt's causal one, whose cost
per pair need not be the same), one prompt is also served alone in small chunks: the same
tokens per step, ever more pairs.
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
# Prompts served alone in the calibration's third pass (capped by the backend's slot length),
# each in one step; then one prompt served alone in chunks of each CHUNK_BUDGETS size.
LONE_PROMPT_LENS = (32, 64, 128, 256, 384)
CHUNKED_PROMPT_LEN, CHUNK_BUDGETS = 256, (32, 64)


def calibration_workload(tokenizer, num_requests: int = 24, seed: int = 0):
    """Chat-like requests, all arriving at once, with prompts and outputs of many lengths."""
    return make_workload(num_requests, "chat", scale="cpu", arrival="at_once", seed=seed,
                         tokenizer=tokenizer, id_prefix="cal")


def calibration_trace(backend: ModelBackend, num_requests: int = 24, max_num_seqs: int = 16,
                      max_num_batched_tokens: int = 96, seed: int = 0, progress: bool = False) -> Trace:
    """Serve the calibration workload on the real model and return its trace (measured steps)."""
    requests = calibration_workload(backend.lm.tokenizer, num_requests, seed)
    # The KV space limits admission by itself (a slot cache: its slots), whatever its kind.
    scheduler = ContinuousBatcher(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                  chunked_prefill=True)
    return Engine(scheduler, backend).run(requests, progress=progress)


def calibrate_cost_model(backend: ModelBackend, num_requests: int = 24, seed: int = 0,
                         progress: bool = False) -> CostModel:
    """Fit the simulator's cost model to real steps measured on ``backend``'s model and device.

    Two passes with different token budgets (a small one for many small mixed steps, a large one
    for whole prompts at once) and a pass of lone prompts of several lengths (one step each) give
    the fit a wide range of step shapes.
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
        scheduler = ContinuousBatcher(max_num_seqs=1, max_num_batched_tokens=budget, chunked_prefill=True)
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
    warnings.warn(f"the cost model misses its own measured steps by {error:.0%} (median); on a quiet "
                  f"machine it is under {POOR_FIT_ERROR:.0%}. Something else was probably using the "
                  "CPU during calibration, so simulated latencies will be off: calibrate again when "
                  "the machine is quiet.", RuntimeWarning, stacklevel=2)
    return True
