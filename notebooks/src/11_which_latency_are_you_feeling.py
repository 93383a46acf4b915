# %% [markdown]
# # 11 · Which latency are you feeling?
#
# The article ends with a question worth asking every time a model feels slow: *which* slowness
# is it? An answer that takes long to start and an answer that starts at once and then crawls
# have different causes. The first is waiting in a queue and computing the prompt; the second
# is decode throughput, how many tokens per second the server's steps hand each stream. When
# the first token is late at peak hour, your request is fighting others for a place. When the
# stream is slow, the steps you share are slow.
#
# This capstone puts that to work. `data/capstone/` holds traces of five servers, recorded by the
# course's engine on the simulator calibrated on the real model. You are not told how they were
# configured. We diagnose the first one together, fully, and turn every finding into an
# assertion; the other four are yours.
#
# ## What you will learn
#
# - A yardstick for "slow": the same request **alone on an empty server**, predicted by the
#   cost model, and the **excess** waiting every request had beyond it, before its first token
#   and during its stream (`batchlab.analysis.diagnosis`).
# - How to read a trace: latency CDFs, TTFT against arrival time, queue length, a timeline and
#   the batch occupancy, and every token gap tied to the step that produced it.
# - The evidence that tells the causes apart: a queue while the device is idle (a timer), a queue
#   behind a small fixed batch of cheap steps (a low `max_num_seqs`), a queue behind full, heavy
#   steps (not enough capacity), long gaps made by prompt steps (no chunked prefill), and
#   uniformly slow gaps (decode throughput).
# - Which knob to turn: a free setting when one explains the evidence, more capacity (or less
#   load) only when none does.
# - The same two feelings on the real model: the same requests, a late first token under one
#   setting and, under another, a stream that moves at the pace of the bigger steps it shares.

# %% [markdown]
# ## Setup
#
# The traces are files; reading them needs no model. The cost model they were simulated with is
# stored next to them (`cost_model.json`, fitted to the real model on the machine that made
# them), and it gives the yardstick. The real model comes in at the end.

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

# %%
# The course's package: the modules this notebook's sections use.
import batchlab
from batchlab.analysis import metrics
from batchlab.analysis.claims import expect
from batchlab.analysis.diagnosis import (excess_latency, excess_share_before_first_token, idle_while_waiting,
                                         lone_decode_time, lone_ttft, num_waiting_at, steps_with_waiting,
                                         token_gaps)
from batchlab.analysis.plots import plot_latency_cdf, plot_occupancy, plot_timeline
from batchlab.analysis.trace_io import load_trace
from batchlab.analysis.widgets import explore
from batchlab.backends import ModelBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.steptime.roofline import RooflineCostModel
from batchlab.engine import Engine
from batchlab.exercises import check
from batchlab.model import load_model
from batchlab.schedulers import ContinuousBatcher
from batchlab.trace import Trace
from batchlab.vllm_sim import VllmReplica
from batchlab.workloads import make_workload

# %% [markdown]
# The five traces and the cost model they were simulated with, from the course's `data/capstone/`.

# %%
# The course checkout's data/ folder (batchlab is installed from the checkout, here and in Colab).
CAPSTONE = Path(batchlab.__file__).resolve().parents[1] / "data" / "capstone"
cost = CostModel.load(CAPSTONE / "cost_model.json")
traces = {name: load_trace(CAPSTONE / f"{name}.json")
          for name in ("example", "trace_a", "trace_b", "trace_c", "trace_d")}
print(cost)
print({name: len(t.requests) for name, t in traces.items()})

# %% [markdown]
# ## The example: a first look
#
# Start the way a benchmark report would: latency percentiles, throughput, and how busy the
# device was.

# %%
example = traces["example"]
summary = metrics.summarize(example)
summary[["mean", "p50", "p90", "p99", "max"]].round(3)

# %%
device = metrics.device_stats(example)
pd.Series({"requests": len(example.requests),
           "request throughput (req/s)": metrics.throughput(example)["request_throughput"],
           "device busy share": device["busy_share"],
           "mean sequences per step": device["mean_num_seqs"]}).round(3)

# %% [markdown]
# TTFT's p90 is many times its p50, and far beyond anything a token gap does. That already
# points at the first token, but "many times" of what? We need a yardstick.
#
# ## The yardstick: the same request alone
#
# On an empty server a request's prompt is computed in one step and each later token takes one
# decode step of one sequence. The cost model predicts both (`lone_ttft`, `lone_decode_time`).
# Everything a request waited beyond that is **excess**, the price of sharing the server:
# before the first token (queueing, sharing prompt steps) or in the stream (bigger or stalled
# steps).

# %%
STEP_S = lone_decode_time(cost, 100, 2)   # one decode step of one sequence at ~100 tokens of context
print(f"alone: a 64-token prompt's first token in {lone_ttft(cost, 64) * 1e3:.0f} ms, "
      f"then one token every ~{STEP_S * 1e3:.0f} ms")
excess = excess_latency(example, cost)
excess[["ttft", "lone_ttft", "ttft_excess", "stream", "lone_stream", "stream_excess"]].describe(
    percentiles=[0.5, 0.9]).round(3)

# %%
share_before = excess_share_before_first_token(example, cost)
print(f"{share_before:.0%} of all excess waiting happened before the first token")
assert share_before > 0.6, share_before    # users of this server feel a late first token

# %% [markdown]
# The CDFs against the yardstick make it visible: the first-token curve has a long tail far to
# the right of what a lone request gets, while the token gaps stay within a small multiple of a
# lone decode step.

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
plot_latency_cdf(example, metric="ttft", unit="s", logx=True, ax=left, title="TTFT")
left.axvline(excess["lone_ttft"].median(), color="black", linestyle="--", label="alone (median)")
left.legend(fontsize=8, loc="lower right")
plot_latency_cdf(example, metric="itl", unit="ms", ax=right, title="Gaps between tokens")
right.axvline(STEP_S * 1e3, color="black", linestyle="--", label="alone")
right.legend(fontsize=8, loc="lower right")
fig.suptitle("The example: the first token is where the waiting is")
plt.show()

# %% [markdown]
# ## Why is the first token late? Queueing, not prefill
#
# TTFT is queueing (arrival to the first step that computes anything for the request) plus the
# prompt's computation. Which one is it here?

# %%
per_request = metrics.per_request_metrics(example)
queue_share = per_request["queue_time"].sum() / per_request["ttft"].sum()
print(f"queueing is {queue_share:.0%} of all time to first token")
assert queue_share > 0.8, queue_share

# %% [markdown]
# A queue means requests arrived faster than the server let them in. When did that happen? Plot
# each request's TTFT against its arrival time, with the arrival rate and the completion rate in
# 10-second bins and the number of requests waiting.

# %%
def load_picture(trace, bin_s=10.0, title=""):
    """TTFT by arrival time, arrivals and completions per second, and the queue length."""
    pr = metrics.per_request_metrics(trace)
    end = pr["last_token_time"].max()
    edges = np.arange(0.0, end + bin_s, bin_s)
    arrivals = np.histogram(pr["arrival_time"], edges)[0] / bin_s
    completions = np.histogram(pr["last_token_time"], edges)[0] / bin_s
    grid = np.linspace(0.0, end, 800)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
    top.scatter(pr["arrival_time"], pr["ttft"], s=8)
    top.set_yscale("log")
    top.set_ylabel("TTFT (s)")
    bottom.stairs(arrivals, edges, label="arrivals / s")
    bottom.stairs(completions, edges, label="completions / s")
    bottom.set_ylabel("requests / s")
    queue = bottom.twinx()
    queue.plot(grid, num_waiting_at(trace, grid), color="gray", linewidth=1, label="waiting")
    queue.set_ylabel("requests waiting")
    bottom.set_xlabel("time (s)")
    bottom.legend(loc="upper left", fontsize=8)
    top.set_title(title)
    return fig, arrivals, completions

# %%
fig, arrivals, completions = load_picture(example, title="The example: a peak of traffic, and a queue")
plt.show()

# %%
# During the peak, requests arrived faster than the server ever completed them.
print(f"peak arrivals {arrivals.max():.2f}/s; the most the server ever completed: "
      f"{completions.max():.2f}/s")
assert arrivals.max() > 1.1 * completions.max(), (arrivals.max(), completions.max())
peak_bin = int(np.argmax(arrivals))
in_peak = (per_request["arrival_time"] // 10.0).between(peak_bin, peak_bin + 2)
before_peak = per_request["arrival_time"] < 10.0 * max(peak_bin - 1, 1)
ratio = per_request.loc[in_peak, "ttft"].median() / per_request.loc[before_peak, "ttft"].median()
print(f"median TTFT of requests arriving in the peak is {ratio:.0f}x that of those before it")
assert ratio > 5, ratio

# %% [markdown]
# This is the article's peak hour: the same server, the same model, and the first token is
# late only because more people arrived than the server could take in.
#
# A timeline of a stretch of the peak shows it request by request: grey bars (waiting) grow
# longer as the peak goes on; once in, prefill (orange) is short and decoding (blue) looks like
# everyone else's. The occupancy plot shows the batch during the whole run.

# %%
def window(trace, start, end):
    """The requests that arrived in [start, end) and every step that overlaps their lives."""
    reqs = [r for r in trace.requests if start <= r.arrival_time < end]
    last = max((r.token_times[-1] for r in reqs if r.token_times), default=end)
    steps = [s for s in trace.steps if s.end > start and s.start < last]
    return Trace(requests=reqs, steps=steps, meta=trace.meta)


peak_start = 10.0 * peak_bin
plot_timeline(window(example, peak_start, peak_start + 20), max_requests=30,
              title="Requests arriving during the peak: the waits grow")
plt.show()

# %%
ax = plot_occupancy(example, title="The example: sequences and tokens per step")
plt.show()

# %% [markdown]
# ## Which knob? Rule out the free ones first
#
# A queue can have three causes, and only one of them needs money:
#
# 1. **A rule keeps requests out while the device has nothing to do**: a batching timer. Then
#    the device is *idle while people wait*.
# 2. **A setting caps the batch far below what the device can do**: a small `max_num_seqs`. Then
#    the batch sits at one fixed size while a queue grows, and each step costs little more than
#    a step for one sequence: the device could take many more.
# 3. **The device is full**: steps are as large as the memory allows and cost many times a lone
#    step; doubling the batch would add little throughput. Only more capacity (a faster device,
#    more replicas) or less load helps.
#
# "As large as the memory allows" is a limit of its own (notebook 05): the batch can never hold
# more sequences than the KV cache has room for. A real server exposes it through a few knobs:
# the memory budget for the cache (vLLM's `gpu_memory_utilization`), the block size, the most
# sequences at once (`max_num_seqs`), and what happens when blocks run out (preemption and
# recompute; servers count preemptions in their metrics). When the cache is what caps the batch, more
# memory per replica (or a smaller KV footprint per token) is the capacity to buy.

# %%
waited = per_request["queue_time"].sum()
idle_share = idle_while_waiting(example) / waited
print(f"the device was idle for {idle_share:.1%} of the time requests spent waiting")
assert idle_share < 0.05, idle_share       # not a timer: the device was busy whenever anyone waited

steps = steps_with_waiting(example)
busy_while_waiting = steps[steps["num_waiting"] > 0]
batch = busy_while_waiting["num_seqs"]
at_largest = (batch == batch.max()).mean()
print(f"while requests waited the batch held {batch.min()}-{batch.max()} sequences "
      f"(median {batch.median():.0f}; at its largest size in {at_largest:.0%} of those steps); "
      f"a step took {busy_while_waiting['duration'].median() / STEP_S:.1f}x a lone decode step")
assert at_largest < 0.5, at_largest        # no fixed cap: the batch size moves with the requests

# %% [markdown]
# The batch size varies while people wait (it is limited by how many sequences fit in the KV
# memory, not by a fixed setting), and the steps are already several times a lone step. What would a
# twice larger batch buy? The cost model tells us: decode tokens per second at the batch we saw,
# and at twice it.

# %%
def decode_rate(batch_size, context=100, model=cost):
    """Decode tokens per second for a step of batch_size sequences (a cost model's prediction)."""
    return batch_size / model.predict_features(batch_size, batch_size, batch_size * context)


b = int(batch.median())
gain = decode_rate(2 * b) / decode_rate(b)
print(f"doubling the batch from {b} to {2 * b} would raise throughput by {gain - 1:.0%}")
assert gain < 1.25, gain    # the device is nearly full: a bigger batch would not absorb the peak

# %% [markdown]
# That answer belongs to the device the traces were made on: a CPU, where at the example's
# batch the fitted formula puts most of a decode step's time in per-sequence work (a step of a
# few sequences is mostly the fixed cost, as notebook 06 found; a step of this many is not), so
# twice the sequences cost nearly twice the time. On a GPU the same question has the opposite
# answer. A decode step of an 8B model as vLLM runs it on an H100 (notebook 14's step model: vLLM's
# kernels as measured on H100s, and its CPU work per step) is bound by reading the 16 GB of
# weights; the sequences ride along almost free, so doubling the batch nearly doubles throughput,
# until the KV memory (notebook 05) or the compute roof stops it. The measured kernels move the
# answer only a little from the bare datasheet roofline's (printed below, as a contrast): the
# weight read they add is paid once per step whatever the batch. Which limit binds decides the
# knob:

# %%
gpu = VllmReplica("Llama-3-8B", "H100").step_model                               # measured vLLM kernels
datasheet = RooflineCostModel.for_device("Llama-3-8B", "H100", grounded=False)  # the bare roofline, a contrast
gpu_gain, datasheet_gain = (decode_rate(2 * b, model=m) / decode_rate(b, model=m) for m in (gpu, datasheet))
cpu_parts = pd.Series({"fixed (weights, per step)": cost.fixed_s,
                       "per sequence and token": b * (cost.per_seq_s + cost.per_token_s),
                       "attention": b * 100 * cost.per_attention_pair_s})
print(f"batch {b} -> {2 * b}: throughput x{gain:.2f} on the traces' CPU (step time mostly "
      f"{cpu_parts.idxmax()!r}), x{gpu_gain:.2f} predicted for an H100 (x{datasheet_gain:.2f} on the "
      f"datasheet roofline, {datasheet.bound(b, b, b * 100)}-bound)")
assert cpu_parts.idxmax() != "fixed (weights, per step)" and gain < 1.25, cpu_parts
assert datasheet.bound(b, b, b * 100) == "memory" and gpu_gain > 1.8, gpu_gain
assert 0 < datasheet_gain - gpu_gain < 0.15, (datasheet_gain, gpu_gain)   # moved down, only a little

# %% [markdown]
# Finally, check the stream. A full device slows every step, so the gaps are a few times a lone
# step; but they are *even*: no burst of long gaps that a prompt step would cause (compare
# p99 with the median).

# %%
gaps = token_gaps(example)
spread = gaps["gap"].quantile(0.99) / gaps["gap"].median()
print(f"median gap {gaps['gap'].median() / STEP_S:.1f}x a lone step; p99 gap {spread:.1f}x the median")
assert spread < 5, spread

# The diagnosis, put together from the checks above (a summary of them, not a new check).
pinned = at_largest > 0.8
diagnosis = {"slow": "ttft" if share_before > 0.5 else "itl",
             "knob": "more_max_num_seqs" if pinned and gain > 1.25 else "more_capacity"}
diagnosis

# %% [markdown]
# **Diagnosis of the example**: users feel a *late first token*; it is *queueing* at peak
# hour, on a device that was already full (busy, big batches, heavy steps, no idle time). The
# fix is more capacity or less load at peak (more replicas, a faster device, admission control
# that sheds or defers work). Turning settings would not help; a larger batch would only slow
# every stream.
#
# ## A reference card
#
# | what users feel | evidence in the trace | knob |
# |---|---|---|
# | late first token | requests wait while the device is idle; waits close to one fixed value | shorter batching timeout |
# | late first token | a queue behind a batch pinned at one small size; steps barely dearer than a lone step | raise `max_num_seqs` |
# | late first token | a queue behind big, heavy steps; no idle time; a bigger batch adds little | more capacity / less load |
# | slow stream, in bursts | rare long gaps, each produced by a step full of prompt tokens | chunked prefill with a modest token budget |
# | slow stream, steadily | every gap several times a lone step; steps full of decodes; no queue | more capacity / less load |
# | late first token, or a stream that stalls and restarts | the batch stops growing at the KV cache's size; with a paged cache, preemptions recorded (a cache that reserves each request's whole length admits no more instead, and the queue grows) | more KV memory (budget, replicas), fewer `max_num_seqs`, keep blocks free at admission |
#
# `batchlab.analysis.diagnosis` has the tools: `excess_latency`, `excess_share_before_first_token`,
# `idle_while_waiting`, `steps_with_waiting`, `num_waiting_at`, `token_gaps`.
#
# ### Explorer: look at any trace
#
# Pick a trace and a view. The exercises below are about these traces, so look before you
# answer.

# %%
def show_trace(name="example", view="latencies"):
    """One view of a capstone trace: 'latencies', 'load', 'occupancy' or 'gaps'."""
    trace = traces[name]
    if view == "latencies":
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
        plot_latency_cdf(trace, metric="ttft", unit="s", logx=True, ax=left, title=f"{name}: TTFT")
        plot_latency_cdf(trace, metric="itl", unit="ms", logx=True, ax=right, title=f"{name}: gaps")
        right.axvline(STEP_S * 1e3, color="black", linestyle="--")
        return fig
    if view == "load":
        return load_picture(trace, title=name)[0]
    if view == "occupancy":
        return plot_occupancy(trace, title=f"{name}: sequences and tokens per step").figure
    g = token_gaps(trace)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.scatter(g["step_prefill_tokens"], g["gap"] * 1e3, s=4, alpha=0.3)
    ax.set_xlabel("prompt tokens computed in the step that produced the token")
    ax.set_ylabel("gap before the token (ms)")
    ax.set_title(f"{name}: every token gap, by what its step computed")
    return fig


explore(show_trace, name=list(traces), view=["latencies", "load", "occupancy", "gaps"])

# %%
fig = show_trace("example", "gaps")
plt.show()

# %% [markdown]
# ## The same two feelings on the real model
#
# Traces from a simulator are convenient; here is the same lesson measured. Twelve requests
# arrive together and are served twice by the real model with continuous batching. With
# `max_num_seqs=2`, most of them wait for a place and their first token is late, but once they
# stream, they stream at the pace of a two-sequence step. With room for all twelve, nobody waits
# and the first tokens come at once, but every stream moves at the pace of a twelve-sequence step.

# %%
# NBVAL_IGNORE_OUTPUT
lm = load_model()
ON_GPU = lm.device == "cuda"
NUM = 48 if ON_GPU else 12
backend = ModelBackend(lm, num_slots=NUM, max_seq_len=256)
together = make_workload(NUM, prompt_len=32, output_len=24, arrival="at_once", seed=8,
                         tokenizer=lm.tokenizer)
narrow = Engine(ContinuousBatcher(max_num_seqs=2, max_num_batched_tokens=512), backend).run(together, progress=True)
wide = Engine(ContinuousBatcher(max_num_seqs=NUM, max_num_batched_tokens=2048), backend).run(together)
real = metrics.compare({"max_num_seqs=2": narrow, f"max_num_seqs={NUM}": wide}, label="server")
real[["server", "ttft_p50", "queue_time_p50", "tpot_p50", "e2e_p50"]].round(3)

# %%
narrow_pr = metrics.per_request_metrics(narrow)
wide_pr = metrics.per_request_metrics(wide)
# Narrow: the first token is late, and it is queueing (how late against the wide server's one big
# prefill step depends on the device's price for a prompt token: printed below).
expect("TTFT p50, max_num_seqs=2 / the wide server", narrow_pr["ttft"].median() / wide_pr["ttft"].median(), above=1.5)
expect("share of the narrow server's TTFT spent waiting for a place (median)",
       (narrow_pr["queue_time"] / narrow_pr["ttft"]).median(), above=0.8)
# Wide: no queue at all.
expect("longest wait for a place on the wide server (s)", wide_pr["queue_time"].max(), below=1e-9)

# %% [markdown]
# How much slower is the wide server's stream? Each of its tokens comes out of a step that
# decodes all twelve, so a stream's time per output token is the time of the steps it rides in.
# What a twelve-sequence step costs against a two-sequence one is a property of the device, not
# of the scheduler: where a step's time is mostly reading the weights (a GPU), twelve rows cost
# about what two do; where each row adds its own arithmetic (a small CPU, most of all in fp32),
# the bigger step is slower, by how much depends on the CPU's kernels. Each run's decode-only
# steps say what they cost here, and each stream must get a token from every step it waits through.

# %%
def decode_step_time(trace: Trace) -> float:
    """Mean duration (s) of the run's steps that only decode (no prompt tokens)."""
    steps = trace.steps_df()
    return steps.loc[steps["num_prefill_tokens"] == 0, "duration"].mean()


def tpot_over_its_steps(trace: Trace) -> np.ndarray:
    """Each request's TPOT over the mean duration of the steps run while it streamed (from its
    first token to its last): 1.0 when every one of those steps gave it a token and nothing ran
    between them, 2.0 if it sat out every other step."""
    steps, pr = trace.steps_df(), metrics.per_request_metrics(trace)
    return np.array([r.tpot / steps.loc[(steps["start"] >= r.first_token_time)
                                        & (steps["end"] <= r.last_token_time), "duration"].mean()
                     for r in pr.itertuples()])


for name, trace in (("max_num_seqs=2", narrow), (f"max_num_seqs={NUM}", wide)):
    expect(f"{name}: TPOT / the mean step while the request streamed", tpot_over_its_steps(trace),
           above=0.95, below=1.25)
step_cost = decode_step_time(wide) / decode_step_time(narrow)
slower = wide_pr["tpot"].median() / narrow_pr["tpot"].median()
print(f"on this {lm.device} in {str(lm.dtype).removeprefix('torch.')}, a {NUM}-sequence decode step takes x{step_cost:.2f} "
      f"a 2-sequence one, so the wide server's streams are x{slower:.2f} as slow as the narrow one's; "
      f"the narrow server's first tokens are x{narrow_pr['ttft'].median() / wide_pr['ttft'].median():.1f} as late")

# %% [markdown]
# Neither is wrong in general: which one users prefer depends on what they feel more, a late
# start or a slow stream, and that is what SLOs on TTFT and TPOT (notebook 07) write down.
#
# ## Summary
#
# - "Slow" means slow compared with the same request alone. The cost model gives that yardstick,
#   and the **excess** before the first token and in the stream says which latency users feel.
# - A late first token is queueing or prefill; `queue_time` tells them apart. A queue at peak
#   hour, on a device that is busy with big, heavy steps, needs capacity, not settings.
# - The evidence that separates causes: idle time while people wait (a timer), a batch pinned at
#   a small size with cheap steps (`max_num_seqs`), long gaps produced by prompt steps (chunked
#   prefill), uniformly slow gaps with full decode steps (decode throughput: capacity).
# - Try the free knobs first; pay for capacity when the evidence says the device is full. "Full"
#   includes memory: the KV cache caps the batch, and its knobs are the memory budget, the block
#   size, `max_num_seqs` and preemption (notebook 05).
# - On the real model, the same twelve requests felt either a late first token (a narrow
#   server) or a stream at the pace of a twelve-sequence step (a wide one). What that bigger step
#   costs is the device's property, measured in the run: on a GPU little, on a small CPU in fp32 more.

# %% [markdown]
# ## Exercises
#
# Diagnose each trace: which latency do its users feel (`"ttft"` or `"itl"`), and which one
# knob would help most? Knobs: `"more_max_num_seqs"`, `"chunked_prefill"`, `"more_capacity"`,
# `"shorter_timeout"`. Answer with a dict, e.g. `{"slow": "ttft", "knob": "more_capacity"}`.
# The checker knows how each server was configured and tells you once you are right. Worked
# diagnoses (the rules of this notebook, written as a function) are in
# `solutions/11_which_latency_are_you_feeling.py`.
#
# **11.1** `traces["trace_a"]`

# %%
answer = None  # your code here
check("11.1", answer)

# %% [markdown]
# **11.2** `traces["trace_b"]`

# %%
answer = None  # your code here
check("11.2", answer)

# %% [markdown]
# **11.3** `traces["trace_c"]`

# %%
answer = None  # your code here
check("11.3", answer)

# %% [markdown]
# **11.4** `traces["trace_d"]`

# %%
answer = None  # your code here
check("11.4", answer)
