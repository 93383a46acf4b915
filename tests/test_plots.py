"""Plots and widget helpers on small hand-built traces: labels, titles and artists, not pixels."""

from __future__ import annotations

import sys

import matplotlib

matplotlib.use("Agg")  # tests only; the package never picks a backend

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import LineCollection, PathCollection, PolyCollection  # noqa: E402
from matplotlib.patches import StepPatch  # noqa: E402

from batchlab.analysis.plots import (  # noqa: E402
    PHASE_COLORS, axis_label, plot_latency_cdf, plot_load_curve, plot_occupancy, plot_step_profile,
    plot_timeline)
from batchlab.analysis.widgets import explore  # noqa: E402
from batchlab.plan import ScheduledChunk  # noqa: E402
from batchlab.requests import RequestStatus  # noqa: E402
from batchlab.trace import RequestRecord, StepRecord, Trace  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def record(rid, arrival, token_times, *, streamed=True, release=None, first_scheduled=None,
           prompt_len=3, status=RequestStatus.FINISHED):
    if release is None and streamed and token_times:
        release = token_times[-1]
    return RequestRecord(rid, arrival, prompt_len, max(1, len(token_times)), status,
                         "length" if token_times else "rejected: too long", first_scheduled,
                         list(token_times), release, streamed)


def static_batch_trace() -> Trace:
    """Non-streaming static batching: batch 0 = {A, B}, batch 1 = {C}; R is rejected.

    step  start dur  batch  chunks                      held
    0     0.0   1.0  0      A prefill(3), B prefill(3)  0
    1     1.0   1.0  0      A decode, B decode          0
    2     2.0   1.0  0      A decode                    1   (B done, waits for A)
    3     3.0   1.0  1      C prefill(3)                0
    4     4.0   1.0  1      C decode                    0
    A tokens at 1, 2, 3; B at 1, 2 (released with the batch at 3); C arrives at 0.5, tokens 4, 5.
    """
    pre = lambda rid: ScheduledChunk(rid, 0, 3, True)  # noqa: E731
    dec = lambda rid, pos: ScheduledChunk(rid, pos, 1, True)  # noqa: E731
    steps = [
        StepRecord(0, 0.0, 1.0, [pre("A"), pre("B")], batch_id=0),
        StepRecord(1, 1.0, 1.0, [dec("A", 3), dec("B", 3)], batch_id=0),
        StepRecord(2, 2.0, 1.0, [dec("A", 4)], held_slots=1, batch_id=0),
        StepRecord(3, 3.0, 1.0, [pre("C")], batch_id=1),
        StepRecord(4, 4.0, 1.0, [dec("C", 3)], batch_id=1),
    ]
    reqs = [
        record("A", 0.0, [1.0, 2.0, 3.0], streamed=False, release=3.0, first_scheduled=0.0),
        record("B", 0.0, [1.0, 2.0], streamed=False, release=3.0, first_scheduled=0.0),
        record("C", 0.5, [4.0, 5.0], streamed=False, release=5.0, first_scheduled=3.0),
        record("R", 0.2, [], status=RequestStatus.REJECTED),
    ]
    return Trace(requests=reqs, steps=steps, meta={"policy": "static"})


def continuous_trace(num_requests: int, num_tokens: int = 5, step: float = 0.01) -> Trace:
    """Continuous batching, streamed: request i arrives at i*step, prefills in the next step and
    decodes one token per step after that (every step serves everyone who is running)."""
    running: dict[str, int] = {}
    token_times: dict[str, list[float]] = {f"r{i}": [] for i in range(num_requests)}
    steps, t, i = [], 0.0, 0
    while i < num_requests or running:
        chunks = []
        if i < num_requests:
            rid = f"r{i}"
            chunks.append(ScheduledChunk(rid, 0, 3, True))
            running[rid] = 0
            i += 1
        for rid, made in list(running.items()):
            if made > 0:
                chunks.append(ScheduledChunk(rid, 2 + made, 1, True))
        steps.append(StepRecord(len(steps), t, step, chunks))
        t += step
        for rid in list(running):
            running[rid] += 1
            token_times[rid].append(t)
            if running[rid] == num_tokens:
                del running[rid]
    reqs = [record(f"r{k}", k * step, token_times[f"r{k}"], first_scheduled=k * step)
            for k in range(num_requests)]
    return Trace(requests=reqs, steps=steps, meta={"policy": "continuous"})


def polys(ax):
    return {c.get_label(): c for c in ax.collections if isinstance(c, PolyCollection)}


# --- timeline -------------------------------------------------------------------------------------
def test_timeline_phases_boundaries_and_arrivals():
    trace = static_batch_trace()
    ax = plot_timeline(trace, title="Static batching")
    assert ax.get_title() == "Static batching"
    assert ax.get_xlabel() == "time (s)" and "request" in ax.get_ylabel()
    phases = polys(ax)
    assert set(phases) == {"queued", "prefill", "decode", "done, waiting for batch end"}
    # queued: only C (0.5 -> 3); prefill: A, B, C; decode: A's steps 1-2 merge into one, B, C
    assert len(phases["queued"].get_paths()) == 1
    assert len(phases["prefill"].get_paths()) == 3
    assert len(phases["decode"].get_paths()) == 3
    # B waits from its last token (2) to the batch end (3); C and A are released as they finish
    assert len(phases["done, waiting for batch end"].get_paths()) == 1
    np.testing.assert_allclose(phases["decode"].get_facecolor()[0],
                               matplotlib.colors.to_rgba(PHASE_COLORS["decode"]))
    # two batches start: at 0 (batch 0) and at 3 (batch 1)
    lines = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert len(lines) == 1
    assert sorted(seg[0][0] for seg in lines[0].get_segments()) == [0.0, 3.0]
    # arrivals: 3 accepted marks and 1 rejected cross
    points = {c.get_label(): c for c in ax.collections if isinstance(c, PathCollection)}
    assert len(points["arrival"].get_offsets()) == 3
    assert len(points["arrival (rejected)"].get_offsets()) == 1
    assert [t.get_text() for t in ax.get_yticklabels()] == ["A", "B", "R", "C"]   # by arrival


def test_timeline_limits_rows_and_stays_small_for_many_requests():
    trace = continuous_trace(1500, num_tokens=8, step=0.002)
    ax = plot_timeline(trace, max_requests=1200)
    # a handful of collections, not one artist per token or per request
    assert len(ax.collections) <= 6
    assert "first 1200 of 1500" in ax.get_title()
    # every request decodes in back-to-back steps: one merged decode bar per request
    assert len(polys(ax)["decode"].get_paths()) == 1200
    ax2 = plot_timeline(trace, max_requests=10)
    assert len(ax2.get_yticklabels()) == 10


def test_timeline_rejects_bad_input():
    with pytest.raises(ValueError, match="no requests"):
        plot_timeline(Trace())
    with pytest.raises(ValueError, match="max_requests=0; must be an int >= 1"):
        plot_timeline(static_batch_trace(), max_requests=0)


def test_timeline_draws_on_given_axes():
    fig, axes = plt.subplots(1, 2)
    assert plot_timeline(static_batch_trace(), ax=axes[1]) is axes[1]


# --- occupancy ------------------------------------------------------------------------------------
def test_occupancy_step_functions_with_held_slots():
    trace = static_batch_trace()
    ax = plot_occupancy(trace)
    assert ax.get_xlabel() == "time (s)" and ax.get_ylabel() == "sequences per step"
    assert ax.right_ax.get_ylabel() == "tokens per step"
    assert ax.get_title() == "Batch occupancy over time"
    left = [p for p in ax.patches if isinstance(p, StepPatch)]
    right = [p for p in ax.right_ax.patches if isinstance(p, StepPatch)]
    assert len(left) == 2 and len(right) == 1            # sequences + held shading; tokens
    seqs = left[0].get_data()
    # steps run back to back: one segment per step, no drop to zero in between
    assert seqs.edges.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert seqs.values.tolist() == [2, 2, 1, 1, 1]
    assert right[0].get_data().values.tolist() == [6, 2, 1, 3, 1]
    held = left[1].get_data()
    assert (held.values - held.baseline).tolist() == [0, 0, 1, 0, 0]
    assert ax.get_legend() is not None and len(ax.get_legend().get_texts()) == 3


def test_occupancy_shows_idle_gaps_and_no_held_shading_for_continuous():
    steps = [StepRecord(0, 0.0, 1.0, [ScheduledChunk("a", 0, 2, True)]),
             StepRecord(1, 3.0, 1.0, [ScheduledChunk("a", 2, 1, True)])]
    trace = Trace(requests=[record("a", 0.0, [1.0, 4.0])], steps=steps)
    ax = plot_occupancy(trace, title=None)
    left = [p for p in ax.patches if isinstance(p, StepPatch)]
    assert len(left) == 1
    data = left[0].get_data()
    assert data.edges.tolist() == [0.0, 1.0, 3.0, 4.0] and data.values.tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match="no steps"):
        plot_occupancy(Trace(requests=[record("a", 0.0, [1.0])]))


# --- latency CDF ------------------------------------------------------------------------------------
def test_latency_cdf_one_line_per_trace():
    traces = {"static": static_batch_trace(), "continuous": continuous_trace(20)}
    ax = plot_latency_cdf(traces, metric="ttft")
    lines = ax.get_lines()
    assert len(lines) == 2
    assert [ln.get_label() for ln in lines] == ["static (n=3)", "continuous (n=20)"]
    assert ax.get_xlabel() == "time to first token (ms)"
    assert "fraction of requests" in ax.get_ylabel()
    # static TTFTs: A 3, B 3, C 5 - 0.5 = 4.5 s (non-streamed) -> largest x is 4500 ms, y ends at 1
    x, y = lines[0].get_data()
    assert x.max() == pytest.approx(4500.0) and y[-1] == 1.0


def test_latency_cdf_itl_single_trace_and_errors():
    ax = plot_latency_cdf(continuous_trace(5, num_tokens=4), metric="itl", unit="s")
    assert ax.get_xlabel() == "inter-token latency (s)"
    assert "token gaps" in ax.get_ylabel()
    assert ax.get_lines()[0].get_label() == "continuous (n=15)"     # 5 requests x 3 gaps
    with pytest.raises(ValueError, match="metric='latency'; must be one of"):
        plot_latency_cdf(static_batch_trace(), metric="latency")
    with pytest.raises(ValueError, match=r"unit='us'; must be one of \['s', 'ms'\]"):
        plot_latency_cdf(static_batch_trace(), unit="us")
    one_token = Trace(requests=[record("x", 0.0, [1.0])])
    with pytest.raises(ValueError, match="no tpot values"):
        plot_latency_cdf(one_token, metric="tpot")


# --- load curve ------------------------------------------------------------------------------------
def sweep_table() -> pd.DataFrame:
    rows = []
    for policy, base in (("static", 2.0), ("continuous", 0.5)):
        for rate in (4, 1, 2):             # unsorted on purpose
            rows.append({"policy": policy, "request_rate": rate, "ttft_p99": base * rate,
                         "output_throughput": 10.0 * rate})
    return pd.DataFrame(rows)


def test_load_curve_lines_per_policy():
    ax = plot_load_curve(sweep_table(), x="request_rate", y="ttft_p99", hue="policy", logy=True)
    lines = ax.get_lines()
    assert sorted(ln.get_label() for ln in lines) == ["continuous", "static"]
    for ln in lines:
        assert ln.get_xdata().tolist() == [1, 2, 4]      # sorted by x
    assert ax.get_yscale() == "log"
    assert ax.get_xlabel() == "request rate (req/s)"
    assert ax.get_ylabel() == "time to first token, p99 (s)"
    assert ax.get_title()


def test_load_curve_without_hue_and_errors():
    ax = plot_load_curve(sweep_table().query("policy == 'static'"), y="output_throughput",
                         hue=None, title="Throughput")
    assert len(ax.get_lines()) == 1 and ax.get_title() == "Throughput"
    assert ax.get_ylabel() == "output throughput (tok/s)"
    with pytest.raises(ValueError, match=r"y='goodput'; must be one of \[.*\] \(a column of a load-sweep"):
        plot_load_curve(sweep_table(), y="goodput")
    assert axis_label("queue_time_mean") == "queue time, mean (s)"


# --- step profile ------------------------------------------------------------------------------------
def test_step_profile_with_floor_and_per_token_axis():
    df = pd.DataFrame({"batch_size": [1, 1, 1, 4, 8],
                       "ms_per_step": [10.0, 12.0, 50.0, 14.0, 20.0],
                       "ms_per_token": [10.0, 12.0, 50.0, 3.5, 2.5],
                       "floor_ms": [9.0, 9.0, 9.0, 9.0, 9.0]})
    ax = plot_step_profile(df)
    left = ax.get_lines()
    assert [ln.get_label() for ln in left] == ["time per step", "memory-bandwidth floor"]
    # three repeats at batch size 1 are reduced to their median, 12 ms
    assert left[0].get_xdata().tolist() == [1, 4, 8]
    assert left[0].get_ydata().tolist() == [12.0, 14.0, 20.0]
    assert ax.right_ax.get_lines()[0].get_ydata().tolist() == [12.0, 3.5, 2.5]
    assert ax.get_xlabel() == "batch size (sequences per step)"
    assert ax.get_ylabel() == "time per step (ms)"
    assert ax.right_ax.get_ylabel() == "time per token (ms)"
    assert len(ax.get_legend().get_texts()) == 3


def test_step_profile_custom_columns_and_missing_optional():
    df = pd.DataFrame({"bs": [1, 2], "step_ms": [5.0, 6.0]})
    ax = plot_step_profile(df, batch_size="bs", ms_per_step="step_ms", title="CPU fp32")
    assert len(ax.get_lines()) == 1 and not hasattr(ax, "right_ax")
    assert ax.get_title() == "CPU fp32"
    with pytest.raises(ValueError, match=r"ms_per_step='ms_per_step'; must be one of \['batch_size'\]"):
        plot_step_profile(pd.DataFrame({"batch_size": [1]}))


# --- widgets -------------------------------------------------------------------------------------------
def draw_rate(rate=2.0, n=3, policy="continuous", streamed=True, trace=None):
    """A plain function that draws a figure; the notebook calls it directly or through explore."""
    fig, ax = plt.subplots()
    ax.plot([0, n], [0, rate])
    ax.set_title(f"{policy} rate={rate} n={n} streamed={streamed}")
    draw_rate.calls.append({"rate": rate, "n": n, "policy": policy, "streamed": streamed,
                            "trace": trace})
    return fig


def test_plain_call_needs_no_widgets():
    draw_rate.calls = []
    fig = draw_rate(rate=4)
    assert fig.axes[0].get_title() == "continuous rate=4 n=3 streamed=True"


def test_explore_builds_controls_and_redraws():
    ipywidgets = pytest.importorskip("ipywidgets")
    draw_rate.calls = []
    marker = object()
    box = explore(draw_rate, rate=(0.5, 8, 0.5), n=(1, 10), policy=["static", "continuous"],
                  streamed=False, trace=marker)
    controls = box.children[0].children
    kinds = [type(c).__name__ for c in controls]
    assert kinds == ["FloatSlider", "IntSlider", "Dropdown", "Checkbox"]
    rate, n, policy, _ = controls
    # starts at the function's defaults; fixed values pass through unchanged
    assert (rate.value, n.value, policy.value) == (2.0, 3, "continuous")
    assert rate.continuous_update is False
    assert draw_rate.calls[-1] == {"rate": 2.0, "n": 3, "policy": "continuous", "streamed": False,
                                   "trace": marker}
    rate.value = 6.0
    assert draw_rate.calls[-1]["rate"] == 6.0
    assert isinstance(box, ipywidgets.VBox)


def test_explore_rejects_unknown_parameter_and_bad_slider():
    pytest.importorskip("ipywidgets")
    with pytest.raises(ValueError, match=r"speed=\(1, 2\); must be a control for a parameter of draw_rate"):
        explore(draw_rate, speed=(1, 2))
    with pytest.raises(ValueError, match=r"rate=\(5, 1\); must be a slider .* with min < max"):
        explore(draw_rate, rate=(5, 1))


def test_explore_without_ipywidgets_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)   # makes `import ipywidgets` fail
    with pytest.raises(ImportError, match="needs ipywidgets.*call the function directly"):
        explore(draw_rate, rate=(0.5, 8, 0.5))
