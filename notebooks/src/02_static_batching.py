# %% [markdown]
# # 02 · Static batching
#
# Notebook 01 measured why batching pays: a decode step reads every weight of the model once,
# whether it computes one token or eight. On a GPU that read is most of the step, so a step for
# eight sequences costs about as much as a step for one; on this CPU per-sequence work adds up
# too, so a step for eight costs more than a step for one, but far less than eight steps (notebook
# 01 measured by how much on your machine).
# The simplest way to cash in on that is **static batching**: wait until a fixed
# number of requests is there, run them together to the end, then look at the queue again.
#
# It is cheap and simple, and it makes people wait in two ways. This notebook measures both on
# the real model, counts the batch slots it wastes, and then finds the job it is actually good at.
#
# ## What you will learn
#
# - The static batching rule, written out in 15 lines, and `batchlab`'s `StaticBatcher`, which
#   is the same rule with the bookkeeping a real server needs.
# - Wait #1, for the batch to fill: with a batch of 8 and requests one second apart, the first
#   request waits 7 s before anything is computed for it.
# - Wait #2, for the slowest member: five short answers held back by one long one.
# - What a *held slot* is, how `batchlab` counts the waste (`held_slots`, `slot_waste`), and why a
#   packed step turns that waste into time and memory rather than compute.
# - What streaming changes (the short answers reach their clients early) and what it does not
#   (their slots stay taken until the batch ends).
# - Where static batching is the right tool: an offline job over a saved dataset, measured
#   against serving the same requests one at a time.

# %% [markdown]
# ## Setup
#
# We load the course's model (SmolLM2-135M-Instruct, fp32 on a CPU; on a GPU if there is one) and
# wrap it in a `ModelBackend`, which runs the steps a scheduler plans and reports how long each
# took. The scenes from the article keep their sizes everywhere; only the offline job grows when
# a GPU is present.

# %%
import matplotlib.pyplot as plt
import numpy as np

from batchlab.analysis import metrics
from batchlab.analysis.claims import expect
from batchlab.analysis.plots import plot_occupancy, plot_timeline
from batchlab.analysis.widgets import explore
from batchlab.backends import ModelBackend
from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.exercises import check
from batchlab.model import load_model
from batchlab.schedulers import StaticBatcher
from batchlab.workloads import Range, make_workload
from batchlab.workloads.scripted import scripted_workload

lm = load_model()
ON_GPU = lm.device == "cuda"
print(f"{lm.name} on {lm.device} ({lm.dtype})")

# %%
# The offline job grows on a GPU, where the same cells finish in about the same time.
OFFLINE_REQUESTS = 64 if ON_GPU else 8
OFFLINE_BATCH = 32 if ON_GPU else 8
backend = ModelBackend(lm, num_slots=max(8, OFFLINE_BATCH), max_seq_len=256)
print(backend.describe())

# %% [markdown]
# ## The rule, written out by hand
#
# A static batcher knows one number, the batch size. Its whole policy:
#
# 1. Wait until `batch_size` requests are in the queue.
# 2. Run them together: the first step reads all their prompts and makes each one's first
#    token, then one decode step after another makes one more token for each.
# 3. Nobody joins a running batch and nobody leaves it. The batch is over when its longest
#    member has its last token; only then are the answers handed back (a non-streaming server)
#    and the next batch formed.
#
# Here is that rule as a loop over a timeline. To keep it readable, every step takes the same
# `step_s` seconds; we will put the real model's measured steps in its place in a moment.

# %%
def static_batching_by_hand(arrivals, output_lens, batch_size, step_s):
    """Batch start and release time of every request under static batching (non-streaming).

    Every step takes step_s seconds; a batch runs one step per token of its longest member.
    """
    n = len(arrivals)
    start, release = [0.0] * n, [0.0] * n
    server_free = 0.0
    for first in range(0, n, batch_size):
        members = range(first, min(first + batch_size, n))  # the last batch may be partial
        # The batch leaves once its last member is here and the previous batch is over.
        t0 = max(server_free, max(arrivals[i] for i in members))
        # Nobody leaves early: the batch lasts as long as its longest member.
        t1 = t0 + step_s * max(output_lens[i] for i in members)
        for i in members:
            start[i], release[i] = t0, t1
        server_free = t1
    return start, release

# %% [markdown]
# The article's scene: a batch size of 8, and requests arriving one second apart. Each asks for
# 8 tokens, and a step takes 50 ms (about a CPU decode step of this model).

# %%
ARRIVALS = [float(t) for t in range(8)]       # one request per second
OUTPUT_LENS = [8] * 8
STEP_S = 0.05

start, release = static_batching_by_hand(ARRIVALS, OUTPUT_LENS, batch_size=8, step_s=STEP_S)
waits = np.array(start) - np.array(ARRIVALS)
print("wait before the batch starts (s):", waits.round(2).tolist())
assert waits[0] == 7.0 and waits[6] == 1.0 and waits[7] == 0.0, waits

# %% [markdown]
# Request 1 waits 7 s for request 8, request 7 waits 1 s for it, and only the last arrival starts
# at once. Nothing about the model decides this: the batch is simply not full.
#
# `batchlab.schedulers.StaticBatcher` is the same rule, with the bookkeeping a real server needs
# (KV-cache space, finished members, streaming, a final partial batch when the input ends).
# Run on the simulator with a "cost model" that says every step takes exactly `STEP_S`, it must
# give the very same times as our loop: on the article's scene, and on 30 random requests
# (Poisson arrivals, 1 to 40 tokens each), where batches also queue behind each other and the
# last one is partial.

# %%
constant_steps = CostModel(fixed_s=STEP_S, per_seq_s=0.0, per_token_s=0.0, per_attention_pair_s=0.0)
rng = np.random.default_rng(0)
scenes = {"article": (ARRIVALS, OUTPUT_LENS),
          "random": (np.cumsum(rng.exponential(0.2, 30)).tolist(), rng.integers(1, 41, 30).tolist())}
for name, (arrivals, output_lens) in scenes.items():
    requests = scripted_workload(arrivals, output_lens)                   # simulated requests
    sim = SimBackend(constant_steps, kv_capacity_tokens=4096)
    by_batchlab = Engine(StaticBatcher(8), sim).run(requests).requests_df()
    by_hand = static_batching_by_hand(arrivals, output_lens, batch_size=8, step_s=STEP_S)
    assert np.allclose(by_batchlab["first_scheduled_time"], by_hand[0]), f"{name}: starts differ"
    assert np.allclose(by_batchlab["release_time"], by_hand[1]), f"{name}: releases differ"
print("StaticBatcher agrees with the hand-written loop on both scenes")

# %% [markdown]
# ## Wait #1 on the real model: the batch must fill
#
# Now the same scene on the real model: 8 requests of 16 prompt tokens, one per second, each
# asking for 8 tokens. The engine runs on a *virtual clock*: arrivals keep their times on the
# workload's timeline, each step advances the clock by the time the model really took to compute
# it, and idle gaps are skipped instead of slept through. So the wait below is the rule's, and the
# compute after it is the model's.

# %%
# NBVAL_IGNORE_OUTPUT
fill_scene = scripted_workload(ARRIVALS, max_new_tokens=8, prompt_len=16, tokenizer=lm.tokenizer)
trace_fill = Engine(StaticBatcher(8), backend).run(fill_scene)

fill = metrics.per_request_metrics(trace_fill).set_index("request_id")
fill[["arrival_time", "queue_time", "e2e"]].round(3)

# %%
# NBVAL_IGNORE_OUTPUT
# The first request waits exactly 7 s for the eighth; the seventh waits 1 s.
assert abs(fill.loc["r000", "queue_time"] - 7.0) < 1e-9, fill.loc["r000", "queue_time"]
assert abs(fill.loc["r006", "queue_time"] - 1.0) < 1e-9, fill.loc["r006", "queue_time"]
assert (fill["first_scheduled_time"] == ARRIVALS[-1]).all(), "everyone starts when the 8th arrives"
print(f"request 1 waited {fill.loc['r000', 'queue_time']:.1f} s of its "
      f"{fill.loc['r000', 'e2e']:.2f} s end-to-end latency for the batch to fill")

# %% [markdown]
# In the timeline each row is a request: grey while queued, orange while its prompt is computed,
# blue while it decodes. The dashed line is where the batch starts.

# %%
plot_timeline(trace_fill, title="Static batch of 8: the first request waits 7 s for the eighth")
plt.show()

# %% [markdown]
# ## Wait #2: the slowest member holds everyone
#
# The second problem starts once the batch runs. Six requests arrive together (so nobody waits
# for the batch to fill), five want 4 tokens and one wants 48. The short ones have their last
# token after 4 steps. Do they get their answers then?

# %%
# NBVAL_IGNORE_OUTPUT
SHORT, LONG = 4, 48
held_scene = scripted_workload([0.0] * 6, max_new_tokens=[SHORT] * 5 + [LONG], prompt_len=16,
                               tokenizer=lm.tokenizer)
trace_held = Engine(StaticBatcher(6), backend).run(held_scene)

held = metrics.per_request_metrics(trace_held).set_index("request_id")
held[["num_output_tokens", "last_token_time", "e2e", "release_wait"]].round(3)

# %%
# NBVAL_IGNORE_OUTPUT
short_ids = [r.request_id for r in held_scene if r.max_new_tokens == SHORT]
long_id = held_scene[-1].request_id
finished_alone = trace_held.requests_df().set_index("request_id")["finish_time"]
# Non-streaming: every answer is handed back when the batch ends, i.e. with the longest one.
assert np.allclose(held.loc[short_ids, "e2e"], held.loc[long_id, "e2e"]), held["e2e"]
# The short answers were ready long before: most of their latency is waiting for the long one.
short_share = (held.loc[short_ids, "release_wait"] / held.loc[short_ids, "e2e"]).min()
assert short_share > 0.5, short_share
print(f"short answers were done at {finished_alone[short_ids].max():.2f} s but released at "
      f"{held.loc[long_id, 'e2e']:.2f} s: {short_share:.0%} of their latency was waiting")

# %% [markdown]
# The purple bars are answers that are finished and waiting for their batch to end.

# %%
plot_timeline(trace_held, title="Five short answers held back by one long one (non-streaming)")
plt.show()

# %% [markdown]
# ## Counting the waste: held slots
#
# While the long request decodes alone, the batch still has six places and five of them hold a
# finished request. `batchlab` calls those **held slots** and records how many each step had.
#
# - A **padded** implementation (the classic way: one rectangular tensor of `batch_size` rows)
#   keeps running the finished rows through the model, computing padding nobody reads.
# - `batchlab`'s step is **packed**: it feeds only the rows that still have work, so it computes
#   nothing for a held slot. The waste does not vanish; it changes form. The slot cannot take a
#   waiting request until the batch ends (lost *time*: throughput and other people's waits), and
#   the finished request keeps its KV-cache space reserved (lost *memory*).
#
# `metrics.slot_waste` is the share of slot-time that was held:
# `sum(held_slots * duration) / sum((num_seqs + held_slots) * duration)` over the steps.

# %%
# NBVAL_IGNORE_OUTPUT
steps = trace_held.steps_df()
steps.assign(ms=steps["duration"] * 1e3)[["step", "num_seqs", "held_slots", "ms"]].iloc[[0, 1, 3, 4, 5, -1]].round(1)

# %%
# NBVAL_IGNORE_OUTPUT
by_hand = (steps["held_slots"] * steps["duration"]).sum() / \
          ((steps["num_seqs"] + steps["held_slots"]) * steps["duration"]).sum()
waste = metrics.slot_waste(trace_held)
assert abs(waste - by_hand) < 1e-12, (waste, by_hand)        # the formula above, by definition
# The claim, in slot-steps (a count, so a busy CPU that slows some steps more than others cannot
# blur it): most of the batch's slots were held by finished requests.
held_share = steps["held_slots"].sum() / (steps["num_seqs"] + steps["held_slots"]).sum()
assert held_share > 0.5, f"most slot-steps should be held by finished requests, got {held_share:.2f}"
held_kv = sum(r.max_total_tokens for r in held_scene if r.request_id in short_ids)
print(f"slot waste: {waste:.0%} of slot-time; {steps['held_slots'].sum()} held slot-steps; "
      f"{held_kv} KV tokens stay reserved by finished requests until the batch ends")

# %% [markdown]
# The occupancy plot shows the same thing over time: sequences computed per step (blue), and the
# held slots stacked on top (red).

# %%
plot_occupancy(trace_held, title=f"{waste:.0%} of the batch's slot-time is held by finished requests")
plt.show()

# %% [markdown]
# On a device where a step's cost is mostly reading the weights, a padded step of 6 rows costs
# about what a packed step of 1 costs, so packing alone saves little time here. The real loss is
# what those five slots could have done: serve five other requests. Only a policy that lets new
# requests into a running batch can recover that (continuous batching, notebook 04).

# %% [markdown]
# ## Streaming: what changes and what does not
#
# A streaming server sends each token as soon as it is computed. With `stream=True` a short
# request's answer is complete when *it* finishes, not when the batch does.

# %%
# NBVAL_IGNORE_OUTPUT
trace_stream = Engine(StaticBatcher(6, stream=True), backend).run(held_scene)
streamed = metrics.per_request_metrics(trace_stream).set_index("request_id")

side_by_side = {"non-streaming": held, "streaming": streamed}
{name: df.loc[short_ids, ["ttft", "e2e"]].median().round(3).to_dict() for name, df in side_by_side.items()}

# %%
# NBVAL_IGNORE_OUTPUT
# What changes: the short requests' answers are complete when they finish, long before the batch
# ends (without streaming they end with it, as shown above).
ratio = streamed.loc[short_ids, "e2e"].median() / streamed.loc[long_id, "e2e"]
# In steps (a count, immune to a busy CPU): a short answer is complete after its own last step.
ends = trace_stream.steps_df()["end"].to_numpy()
short_done = max(r.token_times[-1] for r in trace_stream.requests if r.request_id in short_ids)
short_done_step = int(np.searchsorted(ends, short_done)) + 1          # the step that ended then
assert short_done_step / len(ends) < 0.2, (short_done_step, len(ends))
# What does not: the batch still runs to its longest member, with the same held slots each step.
assert trace_stream.steps_df()["held_slots"].tolist() == steps["held_slots"].tolist()
print(f"streaming: short answers complete after step {short_done_step} of {len(ends)} (E2E {ratio:.2f} of "
      f"the batch's); held slots per step unchanged, slot waste "
      f"{metrics.slot_waste(trace_stream):.0%}")

# %%
fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
plot_timeline(trace_held, ax=axes[0], title="non-streaming: answers leave with the batch")
plot_timeline(trace_stream, ax=axes[1], title="streaming: answers leave when done, slots stay held")
fig.tight_layout()
plt.show()

# %% [markdown]
# Streaming fixes what the client sees, not what the server can do: the next batch still cannot
# start before the long request ends, and a request arriving meanwhile still waits for it.
#
# ## Where static batching is right: an offline job
#
# Both waits hurt only when someone is waiting for a particular answer. An offline job (label a
# saved dataset, translate a document archive, score a test set) has every input from the start
# and only cares when the *whole* job is done. There static batching is exactly right: every
# batch is full from the first step, and each step serves `batch_size` requests for the price of
# about one.
#
# We serve the same dataset twice on the real model: one request at a time (`StaticBatcher(1)`),
# and in batches.

# %%
# NBVAL_IGNORE_OUTPUT
offline = make_workload(OFFLINE_REQUESTS, prompt_len=16, output_len=Range(16, 32), arrival="at_once",
                        seed=2, tokenizer=lm.tokenizer)
offline_traces = {
    "one at a time": Engine(StaticBatcher(1), backend).run(offline, progress=True),
    f"static, batch {OFFLINE_BATCH}": Engine(StaticBatcher(OFFLINE_BATCH), backend).run(offline, progress=True),
}

# %%
# NBVAL_IGNORE_OUTPUT
offline_table = metrics.compare(offline_traces).set_index("policy")
offline_table[["duration", "output_throughput", "mean_num_seqs", "slot_waste", "e2e_mean"]].round(3)

# %%
# NBVAL_IGNORE_OUTPUT
alone, batched = offline_table["output_throughput"]
speedup = batched / alone
assert speedup > 2.0, f"batching should multiply offline throughput, got x{speedup:.2f}"
print(f"batching the offline job: x{speedup:.1f} output tokens per second")
e2e_alone, e2e_batched = offline_table["e2e_mean"]
expect("mean E2E, batched / one at a time (every request is there from the start)",
       e2e_batched / e2e_alone, below=1.0)

# %% [markdown]
# The batched job finishes several times sooner, and even its *mean* end-to-end latency is lower:
# in a queue served one at a time, the last request waits for everyone before it. The held-slot
# waste is still there (outputs of 16 to 32 tokens share each batch), and continuous batching will
# remove it; but for a job nobody watches, static batching's simplicity is hard to beat.

# %% [markdown]
# ## Explorer: batch size against arrival rate
#
# For live traffic the picture depends on how fast requests come. The explorer serves 24
# chat-like requests (Poisson arrivals) on the simulator, with step times from a cost model
# fitted to every real step this notebook measured. The rate slider is in requests per second;
# its starting point is half of what this device serves in full batches of 8, so the picture
# means the same on a slow CPU and a fast GPU. Try a large batch at a low rate (long waits to
# fill), then a high rate (batches fill fast, but everyone waits for the slowest).

# %%
# NBVAL_IGNORE_OUTPUT
measured_steps = [s for t in (trace_fill, trace_held, trace_stream, *offline_traces.values())
                  for s in t.steps[1:]]            # the very first step of a run may be cold
cost = CostModel.fit(measured_steps, source=f"{lm.name} on {lm.device}, this notebook's steps")
full_load = make_workload(24, "chat", arrival="at_once", seed=0)
capacity = metrics.throughput(Engine(StaticBatcher(8), SimBackend(cost, kv_capacity_tokens=64 * 512))
                              .run(full_load))["request_throughput"]
RATE = round(0.5 * float(capacity), 3)
print(cost)
print(f"full batches of 8 serve {capacity:.2f} req/s on this device; the explorer starts at {RATE} req/s")

# %%
def show_static(batch_size=8, rate=RATE, stream=False):
    """Timeline of 24 simulated chat requests under StaticBatcher(batch_size) at `rate` req/s."""
    requests = make_workload(24, "chat", arrival="poisson", rate=rate, seed=0)
    sim = SimBackend(cost, kv_capacity_tokens=64 * 512)
    trace = Engine(StaticBatcher(batch_size, stream=stream), sim).run(requests)
    per = metrics.per_request_metrics(trace)
    ax = plot_timeline(trace, title=f"batch {batch_size} at {rate:g} req/s: median wait to start "
                                    f"{per['queue_time'].median():.2f} s, slot waste "
                                    f"{metrics.slot_waste(trace):.0%}")
    return ax.figure

# %%
fig = show_static(batch_size=8, rate=RATE)
plt.show()

# %%
explore(show_static, batch_size=(1, 16), rate=(RATE / 8, 4 * RATE, RATE / 8), stream=False)

# %% [markdown]
# ## Summary
#
# - Static batching waits for exactly `batch_size` requests, runs them to the end of the longest,
#   and only then forms the next batch. Our 15-line loop and `StaticBatcher` give identical times.
# - Wait #1: early arrivals wait for the batch to fill. Batch of 8, one request per second: the
#   first waits 7 s before any compute (measured on the real model's trace).
# - Wait #2: the batch lasts as long as its slowest member. Five 4-token answers were released
#   with a 48-token one; most of their latency was waiting.
# - Held slots: finished members keep their place until the batch ends. `batchlab`'s packed step
#   computes nothing for them, so the waste is time (slots that cannot serve anyone else) and
#   memory (KV space still reserved), not arithmetic. Here most of the batch's slots, step by
#   step, were held.
# - Streaming gets short answers to their clients early but leaves the held slots exactly as
#   they were.
# - For an offline job, where only the total time matters, static batching multiplied the real
#   model's throughput over one-at-a-time.
#
# Next, dynamic batching removes wait #1 with a timer. Wait #2 stays.

# %% [markdown]
# ## Exercises
#
# Each exercise has a checker: put your answer in `answer` and run the cell. Worked solutions are
# in `solutions/02_static_batching.py`.
#
# **02.1** A static batcher with a batch size of 8 receives requests 0.5 s apart. On average, how
# many seconds does a request of one full batch wait for the batch to fill (from its arrival to
# the batch's start)? Work it out, then check it with `static_batching_by_hand` or `StaticBatcher`.

# %%
answer = None  # your code here
check("02.1", answer)

# %% [markdown]
# **02.2** One static batch holds six requests that arrive together and want 4, 4, 4, 4, 4 and 48
# tokens. If every step takes the same time, what share of the batch's slot-time is held by
# finished requests (`slot_waste`, a number between 0 and 1)? Count it by hand, then confirm it
# with the simulator and `constant_steps`.

# %%
answer = None  # your code here
check("02.2", answer)

# %% [markdown]
# **02.3** Suppose a step for `b` sequences takes `40 ms + 5 ms * b` (prompt steps included), and
# an offline job of 64 requests, each making 32 tokens, is served either one at a time or in
# static batches of 16. By what factor does batching raise the output-token throughput?
# (Hint: a `CostModel` with `fixed_s=0.040` and `per_seq_s=0.005` is exactly this step cost.)

# %%
answer = None  # your code here
check("02.3", answer)
