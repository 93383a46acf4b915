"""Prefill stalls: what a newcomer's long prompt does to the requests already decoding.

The rules and their reasons: ``docs/workloads-and-metrics.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from batchlab.analysis.diagnosis import token_gaps
from batchlab.analysis.plots import PHASE_COLORS
from batchlab.backends.base import Backend
from batchlab.steptime.cost_model import CostModel
from batchlab.checks import check_choice, check_instance, check_int, check_number, fail
from batchlab.engine import Engine
from batchlab.plan import chunk_attention_pairs
from batchlab.requests import Request
from batchlab.schedulers import ContinuousBatcher
from batchlab.trace import Trace
from batchlab.workloads import make_workload

LONG_PREFIX = "long"
RUNNING_PREFIX = "run"
SHORT_PREFIX = "short"

SUMMARY_COLUMNS = [
    "long_ttft", "long_prefill_time", "long_prefill_steps", "admission_gap", "prefill_itl_max",
    "running_itl_median", "running_itl_max", "stall_ratio", "prefill_itl_max_rel",
    "long_prefill_time_rel", "running_e2e_mean",
]


@dataclass(frozen=True)
class StallScenario:
    """A full server on which a long prompt joins requests that are decoding.

    Everyone arrives at t = 0, in this order: ``num_running`` requests with long answers
    (prompt ``running_prompt_len``, ``running_output_len`` tokens out), one with a short answer
    (``short_output_len`` tokens), and one with a ``long_prompt_len``-token prompt
    (``long_output_len`` tokens out). The server runs at most ``max_num_seqs = num_running + 1``
    sequences, so the long prompt waits for a slot. When the short answer is done, its slot is
    free and the long prompt joins at the very next step, next to the ``num_running`` requests
    still decoding.

    The moment is set in steps, not seconds: it comes at the same point of the run on any
    machine, fast or slow, even if the machine's speed changes between runs.

    Ids: ``run000, run001, ...``, ``short000`` and ``long000``. The defaults keep the real
    model on a CPU to a few seconds: four decode-heavy requests of 48 tokens, and a 400-token
    prompt (the CPU scale of the ``prefill_heavy`` preset).
    """

    num_running: int = 4
    running_prompt_len: int = 16
    running_output_len: int = 48
    short_output_len: int = 6
    long_prompt_len: int = 400
    long_output_len: int = 8

    def __post_init__(self) -> None:
        for name in ("num_running", "running_prompt_len", "running_output_len", "short_output_len",
                     "long_prompt_len", "long_output_len"):
            check_int(name, getattr(self, name))
        if self.short_output_len >= self.running_output_len:
            fail("short_output_len", self.short_output_len,
                 f"< running_output_len={self.running_output_len!r}",
                 "the short answer's end is what lets the long prompt in while the others decode")

    @property
    def max_num_seqs(self) -> int:
        """Sequences the server may run at once: the running requests and the short one."""
        return self.num_running + 1

    @property
    def long_id(self) -> str:
        return f"{LONG_PREFIX}000"

    @property
    def short_id(self) -> str:
        return f"{SHORT_PREFIX}000"

    @property
    def running_ids(self) -> list[str]:
        return [f"{RUNNING_PREFIX}{i:03d}" for i in range(self.num_running)]

    @property
    def max_seq_len(self) -> int:
        """KV slot length that holds any request of the scenario."""
        return max(self.running_prompt_len + self.running_output_len,
                   self.long_prompt_len + self.long_output_len)

    def control_requests(self, tokenizer=None) -> list[Request]:
        """The running requests and the short one, without the newcomer: the control run.

        With ``tokenizer`` the prompts are real corpus text (for the real model); without it the
        requests are simulated (lengths only).
        """
        running = make_workload(self.num_running, prompt_len=self.running_prompt_len,
                                output_len=self.running_output_len, arrival="at_once",
                                tokenizer=tokenizer, id_prefix=RUNNING_PREFIX)
        short = make_workload(1, prompt_len=self.running_prompt_len,
                              output_len=self.short_output_len,
                              arrival="at_once", tokenizer=tokenizer, id_prefix=SHORT_PREFIX)
        return running + short

    def requests(self, tokenizer=None) -> list[Request]:
        """The whole scenario: the control requests, then the long prompt (queued behind them)."""
        long = make_workload(1, prompt_len=self.long_prompt_len, output_len=self.long_output_len,
                             arrival="at_once", tokenizer=tokenizer, id_prefix=LONG_PREFIX)
        return self.control_requests(tokenizer) + long


def long_prompt_len_for(cost_model: CostModel, num_running: int, context_len: int = 32,
                        target_ratio: float = 6.0, max_len: int = 8000, multiple: int = 16) -> int:
    """The shortest prompt (a multiple of ``multiple`` tokens, at most ``max_len``) whose prefill,
    computed in one step next to ``num_running`` decodes at about ``context_len`` tokens of
    context, ``cost_model`` predicts to take ``target_ratio`` times as long as the plain decode
    step. Returns ``max_len`` if even that is not enough (a device where steps cost mostly a
    fixed overhead). This sizes the experiment for whatever device runs it.
    """
    check_int("num_running", num_running)
    check_int("context_len", context_len)
    check_int("max_len", max_len)
    check_int("multiple", multiple)
    check_number("target_ratio", target_ratio, 1, strict=True,
                 hint="how many times the plain decode step the stalled step should take")
    decode_pairs = num_running * chunk_attention_pairs(context_len, 1)
    decode_step = cost_model.predict_features(num_running, num_running, decode_pairs)
    length = multiple
    while length < max_len:
        stall_step = cost_model.predict_features(num_running + 1, num_running + length,
                                                 decode_pairs + chunk_attention_pairs(0, length))
        if stall_step >= target_ratio * decode_step:
            return length
        length += multiple
    return max_len


def prefill_window(trace: Trace, long_id: str) -> tuple[float, float]:
    """(start of the first step that computed part of ``long_id``'s prompt, end of the step that
    gave it its first token): the time its prefill occupied the device."""
    record = _record(trace, long_id)
    if record.first_scheduled_time is None or not record.token_times:
        raise ValueError(f"request {long_id!r} never ran (status {record.status.value})")
    return float(record.first_scheduled_time), float(record.token_times[0])


def stall_summary(trace: Trace, long_id: str = f"{LONG_PREFIX}000") -> pd.Series:
    """The lesson's numbers for one run (seconds):

    - ``long_ttft``: the long request's time to first token (arrival to first token): its wait
      for a slot plus ``long_prefill_time``.
    - ``long_prefill_time``: from the start of the step that admitted it to its first token.
    - ``long_prefill_steps``: how many steps computed part of its prompt.
    - ``admission_gap``: the running requests' largest gap ending in the step that admitted it
      (the first step with part of its prompt).
    - ``prefill_itl_max``: the running requests' largest gap ending while its prompt was being
      computed (from the admission step to the step of its first token, both included): the
      stall it caused. Outside that window runs with and without chunking do the same work, so
      this is the number to compare them by; on a noisy machine it is also far less exposed to
      a random slow step than the maximum over the whole run.
    - ``running_itl_median`` / ``running_itl_max``: median and largest gap between successive
      tokens of the other requests, over the whole run.
    - ``stall_ratio``: ``admission_gap / running_itl_median``.
    - ``prefill_itl_max_rel`` and ``long_prefill_time_rel``: ``prefill_itl_max`` and
      ``long_prefill_time`` divided by ``running_itl_median`` (a typical decode step of this
      run). Runs measured one after another on a shared machine may run at different speeds;
      in units of their own decode step they can still be compared.
    - ``running_e2e_mean``: the running requests' mean end-to-end latency.
    """
    record = _record(trace, long_id)
    start, first_token = prefill_window(trace, long_id)
    admission_end = next(s.end for s in trace.steps if s.start == start)
    prefill_steps = sum(1 for s in trace.steps if start <= s.start < first_token
                        and any(c.request_id == long_id for c in s.chunks))
    gaps = token_gaps(trace)
    running = gaps[(gaps["request_id"] != long_id)].dropna(subset=["gap"])
    if running.empty:
        raise ValueError("the other requests made no token gaps; give them more than one "
                         "output token")
    at_admission = running.loc[np.isclose(running["time"], admission_end, rtol=0, atol=1e-12),
                               "gap"]
    admission_gap = float(at_admission.max()) if len(at_admission) else np.nan
    in_window = running.loc[(running["time"] > start) & (running["time"] <= first_token), "gap"]
    if in_window.empty:
        raise ValueError(
            f"no other request was decoding while {long_id!r}'s prompt was computed (from "
            f"{start:.3f} s to {first_token:.3f} s): they had finished before it was admitted (or "
            "had not started), so this run shows no stall. Admit it earlier or give the others "
            "more tokens to generate.")
    prefill_itl_max = float(in_window.max())
    median = float(running["gap"].median())
    others = [r for r in trace.requests if r.request_id != long_id and r.token_times]
    return pd.Series({
        "long_ttft": float(record.visible_token_times[0] - record.arrival_time),
        "long_prefill_time": first_token - start,
        "long_prefill_steps": prefill_steps,
        "admission_gap": admission_gap,
        "prefill_itl_max": prefill_itl_max,
        "running_itl_median": median,
        "running_itl_max": float(running["gap"].max()),
        "stall_ratio": admission_gap / median,
        "prefill_itl_max_rel": prefill_itl_max / median,
        "long_prefill_time_rel": (first_token - start) / median,
        "running_e2e_mean": float(np.mean([r.visible_token_times[-1] - r.arrival_time
                                           for r in others])),
    }, name="stall", dtype=object)


def budget_sweep(backend: Backend, requests: Sequence[Request], budgets: Iterable[int | None],
                 max_num_seqs: int, long_id: str = f"{LONG_PREFIX}000",
                 progress: bool = False) -> pd.DataFrame:
    """Serve ``requests`` once per token budget with continuous batching; one row per budget.

    ``max_num_seqs``: the server's sequence limit (``StallScenario.max_num_seqs``; it is what
    makes the long prompt wait for a slot).

    ``budgets``: values of ``max_num_batched_tokens`` with chunked prefill; ``None`` means no
    chunking (the whole prompt in one step, with a budget of 2,048 tokens, or more if the
    longest prompt and a decode for every other request need more). Columns:
    ``max_num_batched_tokens``, ``chunked_prefill`` and ``SUMMARY_COLUMNS`` (``stall_summary``).
    The traces are in ``df.attrs["traces"]`` (keyed by budget; ``None`` for no chunking).
    """
    rows, traces = [], {}
    whole_budget = max(2048, max(r.prompt_len for r in requests) + len(requests))
    for budget in budgets:
        if budget is None:
            scheduler = ContinuousBatcher(max_num_seqs=max_num_seqs,
                                          max_num_batched_tokens=whole_budget,
                                          chunked_prefill=False)
        else:
            scheduler = ContinuousBatcher(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                          chunked_prefill=True)
        trace = Engine(scheduler, backend).run(list(requests), progress=progress)
        traces[budget] = trace
        rows.append({"max_num_batched_tokens": scheduler.config.max_num_batched_tokens,
                     "chunked_prefill": scheduler.config.chunked_prefill,
                     **stall_summary(trace, long_id).to_dict()})
    df = pd.DataFrame(rows, columns=["max_num_batched_tokens", "chunked_prefill", *SUMMARY_COLUMNS])
    df = df.astype({c: float for c in SUMMARY_COLUMNS if c != "long_prefill_steps"})
    df.attrs["traces"] = traces
    return df


def plot_token_gaps(trace: Trace, long_id: str = f"{LONG_PREFIX}000", ax: Axes | None = None,
                    unit: str = "ms", title: str | None = None) -> Axes:
    """The other requests' gaps between successive tokens against time (each gap drawn over the
    interval it spans), with the long request's prefill shaded: from the step that admitted it
    to its first token."""
    scale = {"ms": 1e3, "s": 1.0}
    check_choice("unit", unit, scale)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.5))
    gaps = token_gaps(trace).dropna(subset=["gap"])
    running = gaps[gaps["request_id"] != long_id]
    num_running = running["request_id"].nunique()
    # Each gap is drawn over the interval it spans (previous token -> this token), so a stalled
    # step shows as a tall block as wide as the step. Requests that step together overlap.
    for i, (_, group) in enumerate(running.groupby("request_id")):
        label = f"the other {num_running} requests (lines overlap)" if i == 0 else None
        ax.step(group["time"], group["gap"] * scale[unit], where="pre", linewidth=1.2,
                color=PHASE_COLORS["decode"], alpha=0.8, label=label)
    start, first_token = prefill_window(trace, long_id)
    ax.axvspan(start, first_token, color=PHASE_COLORS["prefill"], alpha=0.25,
               label=f"{long_id} prefill (joins → first token)")
    ax.set_xlabel("time (s)")
    ax.set_ylabel(f"gap since previous token ({unit})")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    if title:
        ax.set_title(title)
    return ax


def _record(trace: Trace, request_id: str):
    check_instance("trace", trace, Trace, "a batchlab Trace")
    for r in trace.requests:
        if r.request_id == request_id:
            return r
    raise ValueError(f"request {request_id!r} is not in the trace; it has "
                     f"{[r.request_id for r in trace.requests][:10]}")
