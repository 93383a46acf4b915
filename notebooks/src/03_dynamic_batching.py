# %% [markdown]
# # 03 · Dynamic batching
#
# Static batching (notebook 02) made people wait twice: for the batch to fill, and for its slowest
# member. **Dynamic batching** attacks the first wait with a timer. A batch leaves when it is
# full *or* when its oldest request has waited `timeout` seconds, whichever comes first. This is
# the batching of general-purpose model servers such as NVIDIA Triton's dynamic batcher.
#
# ## What you will learn
#
# - The dynamic batching rule, written out by hand, and `batchlab`'s `DynamicBatcher`, which
#   gives the same batch start times.
# - The guarantee it buys: with an idle server no request waits longer than `timeout` before its
#   batch starts; and what happens when the server is busy, where that bound no longer holds.
# - The trade-off a timeout sets: a longer one gives bigger batches (more work per step) and
#   slower first tokens. A sweep on a simulator calibrated on the real model draws the curve.
# - Where dynamic batching is enough (equal-length work, like an image generator's fixed number
#   of steps) and where it is not (LLM answers of 5 and 500 tokens in one batch: the slowest
#   still holds everyone).

# %% [markdown]
# ## Setup
#
# The real model serves a small scene; a simulator calibrated on it serves the sweeps. The
# calibration measures a few hundred real steps of many shapes and fits the step-time formula of
# `batchlab.steptime.cost_model` (a fixed cost per step, plus costs per sequence, per token and per
# attention pair); it takes some seconds and adapts to whatever device runs this notebook.

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from batchlab.analysis import metrics
from batchlab.analysis.claims import expect
from batchlab.analysis.batches import batches_df
from batchlab.analysis.plots import plot_latency_cdf, plot_timeline
from batchlab.analysis.widgets import explore
from batchlab.backends import ModelBackend
from batchlab.sim import SimBackend
from batchlab.experiments.calibration import calibrate_cost_model
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.exercises import check
from batchlab.model import load_model
from batchlab.schedulers import DynamicBatcher
from batchlab.workloads import make_workload
from batchlab.workloads.scripted import scripted_workload

# %% [markdown]
# The model is loaded once (a few seconds); every section below uses it.

# %%
lm = load_model()
ON_GPU = lm.device == "cuda"
print(f"{lm.name} on {lm.device} ({lm.dtype})")

# %%
# NBVAL_IGNORE_OUTPUT
backend = ModelBackend(lm, num_slots=16, max_seq_len=512)
# reuse=True: the fit notebook 01 stored on this machine, if ~30 fresh steps confirm it (else measured anew)
cost = calibrate_cost_model(backend, progress=True, reuse=True)
print(cost)

# %%
# Simulator sizes: more requests on a GPU machine, where the simulator has more CPU to spare too.
SIM_REQUESTS = 600 if ON_GPU else 300
MAX_BATCH = 8
KV_TOKENS = 1 << 20            # the simulator's KV cache: large enough never to limit a batch


def simulator() -> SimBackend:
    """A fresh simulated device with the calibrated step times."""
    return SimBackend(cost, kv_capacity_tokens=KV_TOKENS)

# %% [markdown]
# ## The rule, written out by hand
#
# `DynamicBatcher`'s docstring states its rule. With no batch running:
#
# - a batch leaves as soon as `max_batch_size` requests are waiting, or
# - when the *oldest waiting request* has waited `timeout` seconds, with whoever is there.
#
# While a batch runs nobody joins it, and newcomers queue. When it ends, the same rule is applied
# to the queue as it stands: a request that has already waited `timeout` seconds leaves at once.
# With an idle server the oldest request is the one whose arrival started the timer, so the
# rule matches the article's wording ("the timer starts when the first request arrives").
#
# As in notebook 02, a loop over a timeline. Every batch here takes the same `batch_s` seconds.

# %%
def dynamic_batching_by_hand(arrivals, max_batch_size, timeout, batch_s):
    """The start time of each request's batch under dynamic batching."""
    start = [0.0] * len(arrivals)
    server_free, oldest = 0.0, 0          # oldest: index of the oldest waiting request
    while oldest < len(arrivals):
        # The timer of the oldest waiting request, but never before the server is free...
        leave = max(arrivals[oldest] + timeout, server_free)
        # ...unless the batch fills first: when its max_batch_size-th member arrives.
        last = oldest + max_batch_size - 1
        if last < len(arrivals):
            leave = min(leave, max(arrivals[last], server_free))
        members = [i for i in range(oldest, min(last + 1, len(arrivals))) if arrivals[i] <= leave]
        for i in members:
            start[i] = leave
        server_free, oldest = leave + batch_s, oldest + len(members)
    return start

# %% [markdown]
# A scene with all three cases: at most 4 per batch, a timeout of 0.3 s, and batches of 0.5 s.
# Three requests trickle in (the timer sends them off), five arrive in a rush (the fourth fills a
# batch, the fifth queues behind it), and a last one comes alone.

# %%
SCENE_ARRIVALS = [0.0, 0.1, 0.15, 1.0, 1.02, 1.04, 1.06, 1.08, 2.5]
SCENE_MAX_BATCH, SCENE_TIMEOUT, BATCH_S = 4, 0.3, 0.5

scene_start = dynamic_batching_by_hand(SCENE_ARRIVALS, SCENE_MAX_BATCH, SCENE_TIMEOUT, BATCH_S)
scene_wait = np.array(scene_start) - np.array(SCENE_ARRIVALS)
pd.DataFrame({"arrival": SCENE_ARRIVALS, "batch_start": scene_start, "wait": scene_wait}).round(3).T

# %% [markdown]
# The rush's fifth request (arrival 1.08 s) waited 0.48 s, more than the timeout: its timer ran
# out while the server was busy, so it left the moment the server was free. `DynamicBatcher` on
# a simulator whose batches take exactly `BATCH_S` (5 tokens of 0.1 s steps) gives the same times,
# on this scene and on 60 random Poisson arrivals (where every case occurs many times):

# %%
tenth_of_a_second = CostModel(fixed_s=0.1, per_seq_s=0.0, per_token_s=0.0, per_attention_pair_s=0.0)
random_arrivals = np.cumsum(np.random.default_rng(0).exponential(0.15, 60)).tolist()
for arrivals in (SCENE_ARRIVALS, random_arrivals):
    requests = scripted_workload(arrivals, max_new_tokens=5)         # 5 steps = 0.5 s a batch
    sim = SimBackend(tenth_of_a_second, kv_capacity_tokens=4096)
    trace = Engine(DynamicBatcher(SCENE_MAX_BATCH, SCENE_TIMEOUT), sim).run(requests)
    by_hand = dynamic_batching_by_hand(arrivals, SCENE_MAX_BATCH, SCENE_TIMEOUT, BATCH_S)
    assert np.allclose(trace.requests_df()["first_scheduled_time"], by_hand)
print("DynamicBatcher agrees with the hand-written loop on both scenes")

# %% [markdown]
# ## The bound on the real model: idle against busy
#
# Now the real model computes the batches, with a timeout of 0.5 s and at most 4 per batch. Two
# requests trickle in (at 0 and 0.2 s) and the timer sends them off at 0.5 s. While they run, six
# arrive in a rush: four leave as a full batch the moment the server is free, and the other two
# wait for that batch as well. A last request comes alone, ten seconds in. Each has 16 prompt
# tokens and asks for 16 tokens.
#
# `batchlab.analysis.batches.batches_df` reads the batches back from the trace: their members, start,
# end, the longest wait before the start, and whether the server was **idle** or **busy** when
# the batch's oldest member arrived.

# %%
TIMEOUT = 0.5
real_scene = scripted_workload([0.0, 0.2] + [0.51] * 6 + [10.0], max_new_tokens=16, prompt_len=16,
                               tokenizer=lm.tokenizer)
trace_real = Engine(DynamicBatcher(4, TIMEOUT), backend).run(real_scene, progress=True)
batches = batches_df(trace_real)

# %%
# NBVAL_IGNORE_OUTPUT
batches[["batch_id", "size", "first_arrival", "previous_end", "start", "formed_while", "max_wait"]].round(3)

# %%
eps = 1e-9
idle, busy = batches[batches.formed_while == "idle"], batches[batches.formed_while == "busy"]
# With an idle server, no request waits longer than the timeout before its batch starts.
assert len(idle) >= 1 and (idle["max_wait"] <= TIMEOUT + eps).all(), idle
# The general rule: a batch starts by its oldest member's timer, or when the server frees up.
latest_start = np.maximum(batches["first_arrival"] + TIMEOUT, batches["previous_end"].fillna(0.0))
assert (batches["start"] <= latest_start + eps).all(), batches
# The first batch left by its timer: its oldest member waited exactly the timeout.
first = batches.iloc[0]
assert first.formed_while == "idle" and first["size"] == 2 and abs(first.max_wait - TIMEOUT) < eps, first
# The rush arrived while it ran: a full batch and then the rest leave as the server frees up.
for _, rush in batches.iloc[1:3].iterrows():
    assert rush.formed_while == "busy" and abs(rush.start - rush.previous_end) < eps, rush
print(f"idle batches waited at most {idle['max_wait'].max():.2f} s (timeout {TIMEOUT} s); "
      f"busy ones up to {busy['max_wait'].max():.2f} s")

# %%
plot_timeline(trace_real, title=f"Dynamic batching (max 4, timeout {TIMEOUT} s) on the real model")
plt.show()

# %% [markdown]
# So the guarantee is narrower than it sounds: **the timeout bounds the wait for the batch to
# fill, not the wait for the server.** When requests arrive while a batch runs, they wait for it to
# end, however long that takes, and if more than `max_batch_size` are queued, the later ones wait
# for several batches. Under heavy load the queue, not the timer, decides the wait.
#
# ## The trade-off: a timeout sweep
#
# How long should the timer be? Waiting longer collects more requests per batch (more tokens
# per weight read) and makes every request wait longer. We sweep the timeout on the simulator:
# a few hundred chat-like requests with Poisson arrivals. To make the experiment mean the same
# on any device, the arrival rate is 30% of what this device serves when every batch is full,
# and the timeouts are multiples of the mean gap between arrivals. The sweep streams tokens, so
# TTFT is the wait before the batch plus its first step. (TTFT, its p50 and p99, and the CDF
# plotted further down are defined, with a picture, in the [glossary in notebook 00](00_setup_and_tour.ipynb#glossary).)

# %%
full_batches = make_workload(SIM_REQUESTS, "chat", arrival="at_once", seed=1)
capacity = metrics.throughput(Engine(DynamicBatcher(MAX_BATCH, 0.0), simulator()).run(full_batches))
RATE = 0.3 * float(capacity["request_throughput"])
live = make_workload(SIM_REQUESTS, "chat", arrival="poisson", rate=RATE, seed=1)
TIMEOUTS = [k / RATE for k in (0, 0.5, 1, 2, 4, 8, 16)]
print(f"full batches serve {capacity['request_throughput']:.2f} req/s; we offer {RATE:.2f} req/s")

# %%
rows = []
for timeout in TIMEOUTS:
    trace = Engine(DynamicBatcher(MAX_BATCH, timeout, stream=True), simulator()).run(live)
    b, lat = batches_df(trace), metrics.summarize(trace)
    idle_waits = b.loc[b.formed_while == "idle", "max_wait"]
    rows.append({"timeout": timeout, "mean_batch_size": b["size"].mean(),
                 "ttft_p50": lat.loc["ttft", "p50"], "ttft_p99": lat.loc["ttft", "p99"],
                 "idle_max_wait": idle_waits.max(), "busy_max_wait": b["max_wait"].max()})
sweep = pd.DataFrame(rows)

# %%
# NBVAL_IGNORE_OUTPUT
sweep.round(3)

# %%
# The bound holds at every timeout, for batches formed while the server was idle.
expect("longest wait in an idle-formed batch - its timeout (s)", sweep["idle_max_wait"] - sweep["timeout"],
       below=1e-9)
# Longer timeouts give bigger batches (each step at most 5% smaller, the last 3x the first)...
sizes = sweep["mean_batch_size"].to_numpy()
expect("mean batch size, each timeout over the one before", sizes[1:] / sizes[:-1], above=0.95)
expect("mean batch size, longest timeout / no timeout", sizes[-1] / sizes[0], above=3)
# ...and slower first tokens.
expect("TTFT p50, longest timeout / no timeout", sweep["ttft_p50"].iloc[-1] / sweep["ttft_p50"].iloc[0], above=2)
# Over the last doubling of the timeout, the median levels off while the p99 follows the timer:
# each grows by this share of the timeout's growth (on three seeds: p50 0.02-0.05, p99 0.7-0.85).
last, before = sweep.iloc[-1], sweep.iloc[-2]
growth = (last - before) / (last["timeout"] - before["timeout"])
expect("TTFT p50 growth / timeout growth, last doubling", growth["ttft_p50"], below=0.2)
expect("TTFT p99 growth / timeout growth, last doubling", growth["ttft_p99"], above=0.5)

# %%
fig, left = plt.subplots(figsize=(7, 4))
left.plot(sweep["timeout"], sweep["mean_batch_size"], marker="o", color="black", label="mean batch size")
left.set_xscale("symlog", linthresh=TIMEOUTS[1])      # timeouts double from point to point
left.set_xticks(TIMEOUTS, [f"{t:.2g}" for t in TIMEOUTS])
left.minorticks_off()
left.set_xlabel("timeout (s)")
left.set_ylabel("mean batch size (requests)")
right = left.twinx()
for col, style in (("ttft_p50", "-"), ("ttft_p99", "--")):
    right.plot(sweep["timeout"], sweep[col], linestyle=style, marker=".", label=col.replace("_", " "))
right.set_ylabel("time to first token (s)")
fig.legend(loc="upper left", bbox_to_anchor=(0.12, 0.88), fontsize=8)
left.set_title("A longer timeout buys bigger batches with slower first tokens")
plt.show()

# %% [markdown]
# Read the curve from the left. At a timeout of 0 batches are small, yet the p99 TTFT is not
# small: a request that arrives during a batch waits for it regardless of the timer (the busy
# case above). As the timeout grows, batches fill towards `max_batch_size` and the median TTFT
# climbs. The median levels off once most batches fill before their timer ends (the wait is then
# the time for `max_batch_size` requests to arrive), but the p99 keeps following the timeout:
# whenever traffic lulls, a batch's first request waits out the whole timer. Where to stop depends
# on what the server is for: the batch size buys throughput, the TTFT is what users feel.
#
# ## Equal lengths against mixed lengths
#
# The timer fixed wait #1. Wait #2, the slowest member, is untouched: a batch still runs until its
# longest member ends. How much that matters depends on the work:
#
# - **Equal lengths** (`same_length` preset: 128 tokens in, 128 out, every request), like an image
#   generator that runs the same number of denoising steps for every picture. Every member
#   finishes in the same step, so nobody waits for anybody.
# - **LLM-like mixed lengths** (`mixed_output` preset: 100 tokens in, 5 to 500 out). A 5-token
#   answer can share a batch with a 500-token one.
#
# Both at full scale on the simulator, non-streaming (each answer is handed back when its batch
# ends, as a request-level server does), at half of the load full batches could serve.

# %%
def serve_preset(preset: str, n: int = SIM_REQUESTS):
    """Serve `preset` (full scale) with dynamic batching at half the full-batch capacity."""
    job = make_workload(n, preset, scale="full", arrival="at_once", seed=3)
    cap = metrics.throughput(Engine(DynamicBatcher(MAX_BATCH, 0.0), simulator()).run(job))
    rate = 0.5 * float(cap["request_throughput"])
    requests = make_workload(n, preset, scale="full", arrival="poisson", rate=rate, seed=3)
    return Engine(DynamicBatcher(MAX_BATCH, timeout=2 / rate), simulator()).run(requests)


length_traces = {preset: serve_preset(preset) for preset in ("same_length", "mixed_output")}
per_preset = {preset: metrics.per_request_metrics(t) for preset, t in length_traces.items()}

# %% [markdown]
# For each request, `e2e - queue_time` is its time in the batch (from the batch's start to its
# answer being handed back), and `release_wait` the part of it spent finished, waiting for the
# batch to end.

# %%
same, mixed = per_preset["same_length"], per_preset["mixed_output"]
short = mixed[mixed["num_output_tokens"] <= 50]             # the shortest tenth of the answers
short_held_share = (short["release_wait"] / (short["e2e"] - short["queue_time"])).median()
pd.DataFrame({
    "slot_waste": {p: metrics.slot_waste(t) for p, t in length_traces.items()},
    "max_release_wait_s": {p: df["release_wait"].max() for p, df in per_preset.items()},
    "short_answers_held_share": {"same_length": np.nan, "mixed_output": short_held_share},
}).round(3)

# %%
# Equal lengths: every member finishes in its batch's last step; nothing is held.
assert same["release_wait"].max() == 0.0 and metrics.slot_waste(length_traces["same_length"]) == 0.0
# Mixed lengths: a short answer's time in its batch is mostly its batch's longest member.
assert len(short) >= 10 and short_held_share > 0.7, (len(short), short_held_share)
assert metrics.slot_waste(length_traces["mixed_output"]) > 0.2
print(f"mixed lengths: the {len(short)} answers of <= 50 tokens spent a median "
      f"{short_held_share:.0%} of their time in the batch finished, waiting for its longest member")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True, sharey=True)
for ax, (preset, df) in zip(axes, per_preset.items()):
    in_batch = df["e2e"] - df["queue_time"]                  # batch start -> answer handed back
    ax.scatter(df["num_output_tokens"], in_batch, s=8, alpha=0.6, label="answer handed back")
    ax.scatter(df["num_output_tokens"], in_batch - df["release_wait"], s=8, alpha=0.6,
               label="its last token computed")
    ax.set_xlabel("output tokens")
    ax.set_title(preset)
axes[0].set_ylabel("seconds since its batch started")
axes[1].legend(fontsize=8)
fig.suptitle("Mixed lengths: a 5-token answer is handed back about when a 500-token one is")
plt.show()

# %% [markdown]
# With equal lengths the two dots of every request coincide: dynamic batching is all such a
# workload needs. With mixed lengths the last tokens (orange) rise with the answer's length, as
# they should, but the handed-back answers (blue) form a high, flat band: a short answer is
# handed back with its batch's longest member.
# Streaming would let the short answers out early, but as notebook 02 showed, their slots would
# still be held until the batch ends. The fix is to stop thinking in batches of requests at all:
# schedule every decode step anew (continuous batching, notebook 04).
#
# ## Explorer: timeout and batch size
#
# The sliders re-run the sweep's workload on the simulator with your settings and redraw the
# timeline of the first requests and the TTFT distribution (streaming). Watch the batches
# (dashed lines) grow with the timeout, and the CDF move right.

# %%
def show_dynamic(timeout=0.5, max_batch_size=8, preset="chat"):
    """Timeline and TTFT CDF of the sweep's workload under DynamicBatcher(max_batch_size, timeout)."""
    requests = live if preset == "chat" else make_workload(
        SIM_REQUESTS, preset, arrival="poisson", rate=RATE, seed=1)   # CPU-scale lengths
    trace = Engine(DynamicBatcher(max_batch_size, timeout, stream=True), simulator()).run(requests)
    fig, (ax_t, ax_c) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    sizes = batches_df(trace)["size"]
    shown = 30
    plot_timeline(trace, ax=ax_t, max_requests=shown,
                  title=f"timeout {timeout:.2f} s, max {max_batch_size}: mean batch {sizes.mean():.1f}")
    # Batch lines are drawn for the whole run; show only the time span of the rows drawn.
    last = trace.requests_df().sort_values("arrival_time")["release_time"].iloc[:shown].max()
    ax_t.set_xlim(-0.02 * last, 1.02 * last)
    plot_latency_cdf({f"timeout {timeout:.2f} s": trace}, metric="ttft", unit="s", ax=ax_c)
    fig.tight_layout()
    return fig

# %%
fig = show_dynamic(timeout=TIMEOUTS[3], max_batch_size=MAX_BATCH)
plt.show()

# %%
explore(show_dynamic, timeout=(0.0, round(TIMEOUTS[-1], 2), round(TIMEOUTS[-1] / 40, 3)),
        max_batch_size=(1, 32), preset=["chat", "same_length", "mixed_output"])

# %% [markdown]
# ## Summary
#
# - Dynamic batching sends a batch off when `max_batch_size` requests wait or when the oldest has
#   waited `timeout` seconds. Our loop and `DynamicBatcher` give identical batch starts.
# - With an idle server no request waited longer than the timeout before its batch started (on
#   the real model and at every point of the sweep). With a busy server the timer only says "leave
#   as soon as the server is free": the queue behind a running batch can wait far longer.
# - The timeout trades batch size (throughput) against time to first token, and the sweep shows
#   both moving together; at a timeout of 0 the tail is still set by the batches already running.
# - With equal-length work nothing is held and dynamic batching is enough. With LLM-like mixed
#   lengths the short answers spent most of their time in a batch finished, waiting for its
#   longest member, and a large share of slot-time was held: the slowest still holds everyone.
#
# Next: continuous batching, which schedules per decode step, lets finished sequences leave at
# once and waiting ones join at the next step.

# %% [markdown]
# ## Exercises
#
# Worked solutions are in `solutions/03_dynamic_batching.py`.
#
# **03.1** A dynamic batcher with `max_batch_size=3` and `timeout=0.4` s receives requests at
# `[0.0, 0.2, 0.25, 0.3, 0.9, 2.0, 2.05]` s, and every batch takes 1.0 s. Give the list of batch
# start times, one per request (in arrival order).

# %%
answer = None  # your code here
check("03.1", answer)

# %% [markdown]
# **03.2** With an idle server (batches much shorter than the gaps between them), no batch-size
# limit in reach, and Poisson arrivals at 20 requests/s, what is the mean size of a batch with a
# timeout of 0.2 s? Derive it (who starts the timer, and how many arrive before it ends?), then
# check it on the simulator.

# %%
answer = None  # your code here
check("03.2", answer)

# %% [markdown]
# **03.3** Eight requests arrive together and want `[5, 400, 10, 300, 20, 500, 8, 250]` tokens;
# they are served in two batches of 4 with equal step times. In arrival order the slot waste is
# large. A server that knew the lengths in advance could sort the requests by length first (a
# real LLM server cannot: it only knows `max_new_tokens`). What is the slot waste (0 to 1) when
# the requests are sorted by length, shortest first?

# %%
answer = None  # your code here
check("03.3", answer)
