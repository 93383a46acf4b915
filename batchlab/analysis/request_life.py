"""One request's life, read from a trace: the times every latency metric is made of, and a picture.

The glossary in notebook 00 draws it; ``metrics`` computes the same numbers for every request.
For one finished request with visible token times ``t_1 .. t_n``:

    arrival ── queue ──> first step ── prefill ──> t_1 ── gap ── t_2 ── ... ── t_n
    TTFT = t_1 - arrival     ITL = each gap     TPOT = (t_n - t_1) / (n - 1)     E2E = t_n - arrival
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes

from batchlab.analysis.plots import PHASE_COLORS
from batchlab.checks import check_instance
from batchlab.requests import RequestStatus
from batchlab.trace import RequestRecord, Trace


def _record(trace: Trace, request_id: str) -> RequestRecord:
    check_instance("trace", trace, Trace, "a batchlab Trace")
    for r in trace.requests:
        if r.request_id == request_id:
            if r.status != RequestStatus.FINISHED or not r.token_times:
                raise ValueError(f"request {request_id!r} did not finish "
                                 f"(status {r.status.value}); "
                                 "only a finished request has a whole life to show")
            return r
    raise ValueError(f"no request {request_id!r} in the trace; it has "
                     f"{[r.request_id for r in trace.requests][:10]}")


def request_life(trace: Trace, request_id: str) -> dict:
    """The key times (seconds on the trace's clock) and metrics of one finished request.

    Keys: ``arrival``, ``first_scheduled``, ``token_times`` (visible, shape (n,)), ``queue``
    (arrival to first step), ``prefill`` (first step to first token: its prompt's step or
    chunks), ``ttft``, ``gaps`` (the ITL values, shape (n-1,)), ``tpot`` (NaN for n == 1), ``e2e``.
    """
    r = _record(trace, request_id)
    tokens = np.asarray(r.visible_token_times, dtype=float)          # (n,)
    first_step = r.first_scheduled_time if r.first_scheduled_time is not None else r.arrival_time
    gaps = np.diff(tokens)                                            # (n - 1,)
    return {
        "request_id": r.request_id, "arrival": r.arrival_time, "first_scheduled": first_step,
        "token_times": tokens, "queue": first_step - r.arrival_time,
        "prefill": tokens[0] - first_step, "ttft": tokens[0] - r.arrival_time, "gaps": gaps,
        "tpot": float(gaps.mean()) if len(gaps) else float("nan"),
        "e2e": tokens[-1] - r.arrival_time,
    }


def plot_request_life(trace: Trace, request_id: str, ax: Axes | None = None,
                      title: str | None = None) -> Axes:
    """One request's timeline: arrival, queue, prefill, first token, the gaps, the last token,
    with TTFT and E2E drawn as spans and the longest gap (its worst ITL) marked. Times in ms
    from the request's arrival."""
    life = request_life(trace, request_id)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 2.8))
    t0, ms = life["arrival"], 1e3
    sched, tokens = (life["first_scheduled"] - t0) * ms, (life["token_times"] - t0) * ms
    ax.barh(0, sched, left=0, height=0.5, color=PHASE_COLORS["queued"], label="queue")
    ax.barh(0, tokens[0] - sched, left=sched, height=0.5, color=PHASE_COLORS["prefill"],
            label="prefill")
    if len(tokens) > 1:
        ax.barh(0, tokens[-1] - tokens[0], left=tokens[0], height=0.5, color=PHASE_COLORS["decode"],
                alpha=0.35, label="decode (one token per step)")
    ax.vlines(tokens, -0.25, 0.25, color="black", lw=1)
    ax.plot([0], [0], marker="v", ms=10, color="black", ls="none", label="arrival")
    for y, end, name in ((0.55, tokens[0], "TTFT"), (0.85, tokens[-1], "E2E")):
        ax.annotate("", (end, y), (0, y), arrowprops={"arrowstyle": "<->"})
        ax.text(end / 2, y + 0.05, f"{name} {end:.0f} ms", ha="center")
    ax.text(tokens[0], -0.45, "first token", ha="center", va="top")
    ax.text(tokens[-1], -0.45, "last token", ha="center", va="top")
    if len(tokens) > 1:
        k = int(np.argmax(life["gaps"]))
        ax.annotate("", (tokens[k + 1], -0.3), (tokens[k], -0.3),
                    arrowprops={"arrowstyle": "<->", "color": "red"})
        ax.text((tokens[k] + tokens[k + 1]) / 2, -0.75,
                f"longest gap (ITL) {life['gaps'][k] * ms:.0f} ms; "
                f"TPOT = mean gap {life['tpot'] * ms:.0f} ms", ha="center", va="top", color="red")
    ax.set(ylim=(-1.1, 1.2), yticks=[], xlabel=f"ms since request {request_id} arrived",
           title=title or f"The life of request {request_id}")
    ax.legend(loc="upper right", fontsize=8, ncol=4, bbox_to_anchor=(1.0, -0.35))
    return ax
