"""What every contender's run returns (``ContenderRun``), and where its time went (``OpProfile``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from batchlab.requests import Request, RequestStatus
from batchlab.trace import RequestRecord, Trace


# =============================================================================================
# Contender results
# =============================================================================================

@dataclass
class ContenderRun:
    """One contender's timed run.

    ``trace``: per-request times (seconds since the timed run began; the workload's arrival
    times on the same axis) and output tokens, as a batchlab ``Trace`` so ``batchlab.analysis.metrics``
    measures every contender the same way. ``wall_seconds``: measured around the timed call;
    ``cpu_seconds``: CPU time the whole process (all threads) used meanwhile, which on a shared
    machine says how much work was done whatever share of the cores the process got.
    ``settings``: what was configured. ``extra``: contender-specific facts (steps, tries...).
    """

    name: str
    trace: Trace
    wall_seconds: float
    cpu_seconds: float
    settings: dict
    streamed: bool
    extra: dict = field(default_factory=dict)
    peak_memory_bytes: int | None = None
    memory_method: str = "unavailable"


def _record(req: Request, output_ids: list[int], token_times: list[float], release_time: float,
            streamed: bool, first_scheduled_time: float | None) -> RequestRecord:
    """A finished request as a trace record; the tokens beyond ``max_new_tokens`` are dropped."""
    n = req.max_new_tokens
    if len(output_ids) < n or len(token_times) < n:
        raise RuntimeError(f"request {req.request_id!r} got {len(output_ids)} tokens and "
                           f"{len(token_times)} token times; it needs exactly {n}")
    return RequestRecord(req.request_id, req.arrival_time, req.prompt_len, n, RequestStatus.FINISHED,
                         "length", first_scheduled_time, list(token_times[:n]), release_time,
                         streamed, [int(t) for t in output_ids[:n]])


# =============================================================================================
# Where the time goes: op profile (--profile)
# =============================================================================================

# Categories of torch ops, matched against op names in this order; the rest is "other ops".
OP_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul",
                "mkldnn::_linear_pointwise")),
    ("attention", ("scaled_dot_product", "softmax")),
    ("copies & indexing", ("copy_", "index", "aten::cat", "aten::stack", "fill_", "zero_", "clone",
                           "gather", "scatter", "masked_fill", "aten::where", "aten::empty")),
)


def op_category(name: str) -> str:
    """The category of a torch op name (``OP_CATEGORIES``), else ``"other ops"``."""
    for category, patterns in OP_CATEGORIES:
        if any(p == name if category == "matmul" else p in name for p in patterns):
            return category
    return "other ops"


class OpProfile:
    """``torch.profiler`` over the ops run by the thread that enters it; self time per category.

    The profiler is thread-local, so for transformers' manager it is entered inside the
    generation thread (``_HFManager``). ``seconds`` maps each category to seconds of op self time.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._prof = None

    def __enter__(self) -> "OpProfile":
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU])
        self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._prof.__exit__(*exc)
        totals = dict.fromkeys([c for c, _ in OP_CATEGORIES] + ["other ops"], 0.0)
        for event in self._prof.key_averages():
            totals[op_category(event.key)] += event.self_cpu_time_total / 1e6   # microseconds
        self.seconds = totals
        self._prof = None


def _profile_extra(profile: OpProfile, wall_seconds: float) -> dict:
    """Op seconds per category, and the wall time spent outside torch ops (Python, waiting)."""
    ops = dict(profile.seconds)
    return {"op_seconds": ops, "outside_ops_seconds": max(0.0, wall_seconds - sum(ops.values()))}


