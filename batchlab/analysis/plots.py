"""Figures that read a ``Trace`` (or tables made from traces) and draw one idea each.

The rules and their reasons: ``docs/workloads-and-metrics.md``.
"""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection

from batchlab.analysis.metrics import LATENCY_METRICS, itl_values, per_request_metrics
from batchlab.checks import check_choice, check_instance, check_int, fail
from batchlab.requests import RequestStatus
from batchlab.trace import Trace

# One color per phase of a request's life, used by every figure.
PHASE_COLORS: dict[str, str] = {
    "queued": "#c7c7c7",        # arrived, waiting for its first step
    "prefill": "#ff7f0e",       # prompt chunks being computed
    "decode": "#1f77b4",        # one token per step
    "release_wait": "#9467bd",  # finished, waiting for its batch to end (non-streaming)
    "held": "#d62728",          # batch slots held by finished members (request-level batching)
    "tokens": "#2ca02c",        # tokens per step
}
PHASE_LABELS: dict[str, str] = {
    "queued": "queued", "prefill": "prefill", "decode": "decode",
    "release_wait": "done, waiting for batch end",
}
METRIC_LABELS: dict[str, str] = {
    "ttft": "time to first token", "tpot": "time per output token (excl. 1st)",
    "itl": "inter-token latency", "e2e": "end-to-end latency", "queue_time": "queue time",
}
_UNIT_SCALE = {"s": 1.0, "ms": 1e3}


def _check_table(df: pd.DataFrame, columns: Mapping[str, str | None], what: str) -> None:
    """``df`` is a non-empty DataFrame with each named column (``{argument: column or None}``)."""
    if not isinstance(df, pd.DataFrame) or df.empty:
        fail("df", df, "a non-empty DataFrame", what)
    for name, column in columns.items():
        if column is not None:
            check_choice(name, column, df.columns, hint=f"a column of {what}")


def _new_ax(ax: Axes | None, figsize: tuple[float, float] = (8, 4)) -> Axes:
    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def _rectangles(rows: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                height: float = 0.8) -> np.ndarray:
    """Corner vertices of one rectangle per (row, start, end); shape (k, 4, 2)."""
    half = height / 2
    verts = np.empty((len(rows), 4, 2))
    verts[:, 0] = np.column_stack([starts, rows - half])
    verts[:, 1] = np.column_stack([starts, rows + half])
    verts[:, 2] = np.column_stack([ends, rows + half])
    verts[:, 3] = np.column_stack([ends, rows - half])
    return verts


def _merge_touching(rows: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                    tol: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge intervals of the same row that touch (back-to-back steps) into one rectangle."""
    if len(rows) == 0:
        return rows, starts, ends
    order = np.lexsort((starts, rows))
    rows, starts, ends = rows[order], starts[order], ends[order]
    new = np.ones(len(rows), dtype=bool)
    new[1:] = (rows[1:] != rows[:-1]) | (starts[1:] > ends[:-1] + tol)
    first = np.flatnonzero(new)
    return rows[first], starts[first], np.maximum.reduceat(ends, first)


def plot_timeline(trace: Trace, ax: Axes | None = None, max_requests: int = 40,
                  title: str | None = "Request timeline") -> Axes:
    """A Gantt-like chart: one row per request (the first ``max_requests`` by arrival).

    Each row shows the request's phases: queued (arrival to first scheduled step), prefill (steps
    computing its prompt chunks), decode (steps computing one of its tokens) and, when not
    streamed, the wait from its last token to the release of the response. Arrivals are marked
    (rejected requests with an ``x``), and dashed vertical lines mark where a new request-level
    batch starts (``batch_id`` changes between steps).
    """
    check_instance("trace", trace, Trace, "a batchlab Trace")
    if not trace.requests:
        raise ValueError("the trace has no requests to draw")
    check_int("max_requests", max_requests)
    ax = _new_ax(ax, (9, max(2.5, min(12, 0.22 * min(max_requests, len(trace.requests)) + 1.5))))

    shown = sorted(trace.requests, key=lambda r: r.arrival_time)[:max_requests]
    row_of = {r.request_id: i for i, r in enumerate(shown)}
    span = max([s.end for s in trace.steps] + [r.arrival_time for r in shown]) - \
        min(r.arrival_time for r in shown)
    tol = 1e-9 * max(span, 1.0)

    # Chunk intervals of the shown requests, split by phase.
    chunk_rows, chunk_starts, chunk_ends, chunk_is_decode = [], [], [], []
    for step in trace.steps:
        for c in step.chunks:
            row = row_of.get(c.request_id)
            if row is not None:
                chunk_rows.append(row)
                chunk_starts.append(step.start)
                chunk_ends.append(step.end)
                chunk_is_decode.append(c.is_decode)
    rows = np.array(chunk_rows, dtype=float)
    starts = np.array(chunk_starts, dtype=float)
    ends = np.array(chunk_ends, dtype=float)
    is_decode = np.array(chunk_is_decode, dtype=bool)

    phases: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    queued = [(row_of[r.request_id], r.arrival_time, r.first_scheduled_time) for r in shown
              if r.first_scheduled_time is not None and r.first_scheduled_time > r.arrival_time]
    if queued:
        phases["queued"] = tuple(np.array(col, dtype=float) for col in zip(*queued))
    phases["prefill"] = _merge_touching(rows[~is_decode], starts[~is_decode], ends[~is_decode], tol)
    phases["decode"] = _merge_touching(rows[is_decode], starts[is_decode], ends[is_decode], tol)
    waits = [(row_of[r.request_id], r.token_times[-1], r.release_time) for r in shown
             if not r.streamed and r.token_times and r.release_time is not None
             and r.release_time > r.token_times[-1]]
    if waits:
        phases["release_wait"] = tuple(np.array(col, dtype=float) for col in zip(*waits))

    for phase in ("queued", "prefill", "decode", "release_wait"):
        if phase in phases and len(phases[phase][0]):
            ax.add_collection(PolyCollection(_rectangles(*phases[phase]),
                                             facecolors=PHASE_COLORS[phase], edgecolors="none",
                                             label=PHASE_LABELS[phase]))

    # Batch boundaries: the first step of every request-level batch.
    boundaries, previous = [], None
    for step in sorted(trace.steps, key=lambda s: s.start):
        if step.batch_id is not None and step.batch_id != previous:
            boundaries.append(step.start)
        previous = step.batch_id
    # Only the boundaries within the shown requests' lifetimes, so the x-axis fits them.
    last_shown = max([r.release_time or r.arrival_time for r in shown] + list(ends))
    boundaries = [b for b in boundaries if b <= last_shown]
    if boundaries:
        ax.vlines(boundaries, -0.5, len(shown) - 0.5, colors="black", linestyles="dashed",
                  linewidth=0.8, alpha=0.6, label="batch start")

    rejected = np.array([r.status == RequestStatus.REJECTED for r in shown])
    arrivals = np.array([r.arrival_time for r in shown])
    row_idx = np.arange(len(shown))
    ax.scatter(arrivals[~rejected], row_idx[~rejected], marker="|", s=60, color="black",
               label="arrival", zorder=3)
    if rejected.any():
        ax.scatter(arrivals[rejected], row_idx[rejected], marker="x", s=30,
                   color=PHASE_COLORS["held"], label="arrival (rejected)", zorder=3)

    ax.autoscale_view()
    ax.set_ylim(len(shown) - 0.5, -0.5)   # first arrival at the top
    if len(shown) <= 40:
        ax.set_yticks(row_idx, [str(r.request_id) for r in shown], fontsize=7)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("request (by arrival)")
    if len(trace.requests) > len(shown):
        title = f"{title or ''} (first {len(shown)} of {len(trace.requests)} requests)".strip()
    if title:
        ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return ax


def _step_segments(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Edges of a stairs plot over the steps sorted by start, with an extra zero-valued segment
    only where the device sat idle between two steps. Returns ``(edges, step_of_segment)``:
    ``step_of_segment[j]`` is the index (in start order) of the step drawn as segment ``j``,
    or -1 for an idle gap; ``len(edges) == len(step_of_segment) + 1``."""
    steps = sorted(trace.steps, key=lambda s: s.start)
    starts = np.array([s.start for s in steps], dtype=float)
    ends = np.maximum(np.array([s.end for s in steps], dtype=float), starts)
    ends[:-1] = np.minimum(ends[:-1], starts[1:])   # never let a step overlap the next
    tol = 1e-9 * max(1.0, float(ends[-1] - starts[0]))
    edges, owner = [starts[0]], []
    for k in range(len(steps)):
        if k > 0 and starts[k] > edges[-1] + tol:     # idle gap before this step
            edges.append(starts[k])
            owner.append(-1)
        edges.append(ends[k])
        owner.append(k)
    return np.array(edges), np.array(owner)


def _per_segment(values: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """Per-step values spread over stair segments, 0 in idle gaps."""
    return np.where(owner >= 0, values[np.maximum(owner, 0)], 0.0)


def plot_occupancy(trace: Trace, ax: Axes | None = None,
                   title: str | None = "Batch occupancy over time") -> Axes:
    """Sequences per step (left axis) and tokens per step (right axis) as step functions of time,
    dropping to 0 while the device is idle. Slots held by finished members of a request-level
    batch are shaded on top of the sequences. Returns the left ``Axes``; the right one is
    ``ax.right_ax``."""
    check_instance("trace", trace, Trace, "a batchlab Trace")
    if not trace.steps:
        raise ValueError("the trace has no steps, so there is no occupancy to draw")
    ax = _new_ax(ax)
    steps = sorted(trace.steps, key=lambda s: s.start)
    edges, owner = _step_segments(trace)
    seqs = _per_segment(np.array([s.num_seqs for s in steps], dtype=float), owner)
    held = _per_segment(np.array([s.held_slots for s in steps], dtype=float), owner)
    tokens = _per_segment(np.array([s.num_tokens for s in steps], dtype=float), owner)

    ax.stairs(seqs, edges, color=PHASE_COLORS["decode"], linewidth=1.5, label="sequences per step")
    if held.any():
        ax.stairs(seqs + held, edges, baseline=seqs, fill=True, color=PHASE_COLORS["held"],
                  alpha=0.35, label="held slots (finished, batch not done)")
    right = ax.twinx()
    right.stairs(tokens, edges, color=PHASE_COLORS["tokens"], linewidth=1.0, alpha=0.8,
                 label="tokens per step")
    ax.right_ax = right

    ax.set_xlabel("time (s)")
    ax.set_ylabel("sequences per step")
    right.set_ylabel("tokens per step")
    ax.set_ylim(bottom=0, top=max(1.0, float((seqs + held).max())) * 1.1)
    right.set_ylim(bottom=0, top=max(1.0, float(tokens.max())) * 1.1)
    handles, labels = ax.get_legend_handles_labels()
    h2, l2 = right.get_legend_handles_labels()
    ax.legend(handles + h2, labels + l2, loc="best", fontsize=8)
    if title:
        ax.set_title(title)
    return ax


def plot_latency_cdf(traces: Mapping[str, Trace] | Trace, metric: str = "ttft",
                     ax: Axes | None = None, unit: str = "ms", logx: bool = False,
                     title: str | None = None) -> Axes:
    """Empirical CDF of one latency metric, one line per trace.

    ``metric``: ``ttft``, ``tpot``, ``e2e``, ``queue_time`` (one value per finished request) or
    ``itl`` (every pooled gap between visible tokens); see ``batchlab.analysis.metrics``.
    ``unit``: ``"ms"`` or ``"s"``. A single ``Trace`` is labelled by ``trace.meta["policy"]``
    when present.
    """
    check_choice("metric", metric, LATENCY_METRICS)
    check_choice("unit", unit, _UNIT_SCALE)
    if isinstance(traces, Trace):
        traces = {str(traces.meta.get("policy", "trace")): traces}
    if not isinstance(traces, Mapping) or not traces:
        fail("traces", traces, "a Trace or a non-empty dict of {name: Trace}")
    ax = _new_ax(ax, (6, 4))
    drawn = 0
    for name, trace in traces.items():
        if metric == "itl":
            values = itl_values(trace)
        else:
            values = per_request_metrics(trace)[metric].dropna().to_numpy(dtype=float)
        if len(values) == 0:
            continue
        x = np.sort(values) * _UNIT_SCALE[unit]
        y = np.arange(1, len(x) + 1) / len(x)
        # Start the staircase at 0 so the first step is visible.
        ax.step(np.concatenate([[x[0]], x]), np.concatenate([[0.0], y]), where="post",
                label=f"{name} (n={len(x)})")
        drawn += 1
    if drawn == 0:
        raise ValueError(f"no {metric} values in any trace (no finished requests, or only "
                         "1-token outputs for tpot/itl)")
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(f"{METRIC_LABELS[metric]} ({unit})")
    ax.set_ylabel("fraction of token gaps ≤ x" if metric == "itl" else "fraction of requests ≤ x")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title if title is not None else f"CDF of {METRIC_LABELS[metric]}")
    return ax


def axis_label(column: str) -> str:
    """A readable axis label with units for a column of ``metrics.compare`` / a load sweep."""
    fixed = {
        "request_rate": "request rate (req/s)", "request_throughput": "request throughput (req/s)",
        "goodput": "goodput (req/s)", "output_throughput": "output throughput (tok/s)",
        "total_token_throughput": "total-token throughput (tok/s)",
        "busy_share": "device busy share",
        "mean_num_seqs": "mean sequences per step", "mean_num_tokens": "mean tokens per step",
        "slot_waste": "slot waste (share of slot-time)", "duration": "duration (s)",
        "concurrency": "concurrency (requests)", "max_num_seqs": "max sequences per step",
    }
    if column in fixed:
        return fixed[column]
    metric, _, stat = column.rpartition("_")
    if metric in METRIC_LABELS:
        return f"{METRIC_LABELS[metric]}, {stat} (s)"
    return column


def plot_load_curve(df: pd.DataFrame, x: str = "request_rate", y: str = "ttft_p99",
                    hue: str | None = "policy", ax: Axes | None = None, logy: bool = False,
                    title: str | None = None, xlabel: str | None = None,
                    ylabel: str | None = None) -> Axes:
    """Throughput-latency curves from a tidy load-sweep table: one line per ``hue`` value,
    points sorted by ``x``. Typical columns come from ``metrics.compare`` plus the swept
    ``request_rate``; latency columns are in seconds."""
    _check_table(df, {"x": x, "y": y, "hue": hue}, "a load-sweep table")
    ax = _new_ax(ax, (6, 4))
    groups = [(None, df)] if hue is None else list(df.groupby(hue, sort=True))
    for name, group in groups:
        group = group.sort_values(x)
        ax.plot(group[x].to_numpy(), group[y].to_numpy(), marker="o",
                label=None if name is None else str(name))
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel or axis_label(x))
    ax.set_ylabel(ylabel or axis_label(y))
    ax.grid(alpha=0.3)
    if hue is not None:
        ax.legend(title=hue, fontsize=8)
    ax.set_title(title if title is not None else f"{axis_label(y)} vs {axis_label(x)}")
    return ax


def plot_step_profile(df: pd.DataFrame, batch_size: str = "batch_size",
                      ms_per_step: str = "ms_per_step", ms_per_token: str | None = "ms_per_token",
                      bandwidth_floor_ms: str | None = "floor_ms",
                      ax: Axes | None = None,
                      title: str | None = "Step time vs batch size") -> Axes:
    """Step time against batch size from a profiler table (left axis, ms), with the memory-
    bandwidth floor as a dashed line when the table has it, and time per token on the right axis.

    ``batch_size`` and ``ms_per_step`` columns are required; ``ms_per_token`` and
    ``bandwidth_floor_ms`` are drawn when given and present (pass ``None`` to leave one out).
    Several rows with the same batch size (repeats) are reduced to their median. Returns the left
    ``Axes``; the right one, if drawn, is ``ax.right_ax``.
    """
    _check_table(df, {"batch_size": batch_size, "ms_per_step": ms_per_step}, "a profiler table")
    optional = [c for c in (ms_per_token, bandwidth_floor_ms) if c is not None and c in df.columns]
    table = df[[batch_size, ms_per_step, *optional]].groupby(batch_size).median().sort_index()
    sizes = table.index.to_numpy()

    ax = _new_ax(ax, (6, 4))
    ax.plot(sizes, table[ms_per_step].to_numpy(), marker="o", color=PHASE_COLORS["decode"],
            label="time per step")
    if bandwidth_floor_ms in optional:
        ax.plot(sizes, table[bandwidth_floor_ms].to_numpy(), linestyle="--", color="black",
                label="memory-bandwidth floor")
    handles, labels = ax.get_legend_handles_labels()
    if ms_per_token in optional:
        right = ax.twinx()
        right.plot(sizes, table[ms_per_token].to_numpy(), marker="s", color=PHASE_COLORS["prefill"],
                   label="time per token")
        right.set_ylabel("time per token (ms)")
        right.set_ylim(bottom=0)
        ax.right_ax = right
        h2, l2 = right.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.set_xlabel("batch size (sequences per step)")
    ax.set_ylabel("time per step (ms)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(handles, labels, fontsize=8, loc="best")
    if title:
        ax.set_title(title)
    return ax
