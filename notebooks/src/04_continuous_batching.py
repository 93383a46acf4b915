# %% [markdown]
# # 04 · Continuous batching
#
# Static and dynamic batching (notebooks 02 and 03) schedule whole *requests*: a batch is formed,
# runs until its slowest member is done, and only then does anyone new get in. **Continuous
# batching** changes the unit of scheduling from the request to the *decode step* (Orca's
# "iteration-level scheduling", now the default of vLLM, TensorRT-LLM and TGI). Every step:
#
# 1. one forward pass computes the next token of every active sequence;
# 2. a sequence that has produced its last token leaves the batch right away;
# 3. a waiting request takes the free place at the very next step.
#
# The batch is re-formed at every step, so nobody waits for a batch to fill or for a stranger's
# long answer. This notebook writes the loop by hand, then serves one workload with all three
# policies on the real model and measures what changes.
#
# **Where it comes from.** Continuous batching was introduced by **Orca** (Yu et al., "Orca: A
# Distributed Serving System for Transformer-Based Generative Models", OSDI 2022) with two ideas
# that every server since builds on. *Iteration-level scheduling*: the scheduler runs once per
# iteration (one forward pass, one token per sequence) instead of once per request, so a finished
# request returns at once and a new one joins at the next iteration. *Selective batching*:
# sequences at different positions cannot be stacked into one rectangular tensor, so Orca batches
# only the operations that do not care about position (the projections and the MLP, over all the
# step's tokens flattened into one matrix) and runs attention separately per sequence.
# batchlab's `forward_step` (notebook 00) is built the same way: all the step's tokens in one
# (T, D) matrix for every weight multiply, attention per sequence against its own KV cache.
# vLLM (Kwon et al., "PagedAttention", SOSP 2023) added paged KV-cache memory to it (notebook 05).
#
# ## What you will learn
#
# - Continuous batching as a 20-line loop over the batched step `forward_step`, with sequences
#   joining and leaving between steps.
# - `batchlab`'s `ContinuousBatcher`: the same rule with a token budget, KV-cache admission and
#   the bookkeeping a server needs, and the engine's whole step, `Engine.step`, which reads like
#   the hand-written loop; what its timeline and batch occupancy look like.
# - Static, dynamic and continuous batching on the same Poisson workload with mixed answer
#   lengths, on the real model: TTFT, end-to-end latency, throughput and device busy share side by
#   side, which policy wins each, by how much, and why (TTFT, E2E, p99 and CDF: see the
#   [glossary in notebook 00](00_setup_and_tour.ipynb#glossary)); first with every policy
#   streaming, so only scheduling differs, then what a non-streaming server adds.
# - Does batching change my answer? Token for token the same in fp32 here; in bf16 the answers
#   can part ways at a near-tie, and why: the order of floating-point sums depends on the batch
#   (an appendix).
# - An explorer over the calibrated simulator: how `max_num_seqs` and the arrival rate move the
#   three policies.

# %% [markdown]
# ## Setup
#
# The course's model (SmolLM2-135M-Instruct, fp32 on a CPU; a GPU if there is one), its weights
# rearranged for the batched step, and the sizes of the experiments, larger on a GPU.

# %%
import inspect
from collections import deque
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

# %%
# The course's package: the modules this notebook's sections use.
from batchlab.analysis import metrics
from batchlab.analysis.batches import delivered_at_batch_end
from batchlab.analysis.claims import expect, expect_same_answers
from batchlab.analysis.plots import plot_latency_cdf, plot_occupancy, plot_timeline
from batchlab.analysis.widgets import explore
from batchlab.backends import ModelBackend
from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.exercises import check
from batchlab.loop import run_until
from batchlab.model import load_model
from batchlab.model.divergence import NEAR_TIE, compare_alone_and_together, parted_from_alone
from batchlab.model.llama import LlamaWeights, SeqChunk, forward_step
from batchlab.model.profiler import time_step
from batchlab.schedulers import ContinuousBatcher, DynamicBatcher, StaticBatcher
from batchlab.workloads import Range, make_workload

lm = load_model()
ON_GPU = lm.device == "cuda"
weights = LlamaWeights.from_hf(lm.model)
EXACT = lm.dtype == "float32"      # fp32: answers identical however they are batched (see below)
print(f"{lm.name} on {lm.device} ({lm.dtype})")

# %%
MAX_SEQS = 32 if ON_GPU else 8                       # batch slots of every policy
NUM_REQUESTS = 128 if ON_GPU else 16                 # the real-model workload
OUTPUT_LEN = Range(8, 256) if ON_GPU else Range(4, 48)   # mixed answer lengths (tokens)
CHECK_ALONE = 16 if ON_GPU else 6                    # requests re-served alone to compare tokens

# %% [markdown]
# ## The loop, by hand
#
# Five chat questions, each with a number of tokens to generate and the step at which it shows
# up. The server has three slots (three sequences in flight). The toy requests:

# %%
@dataclass(frozen=True)
class ToyRequest:
    name: str
    prompt_ids: list[int]
    max_new_tokens: int
    arrives_at_step: int


QUESTIONS = ["What is the capital of France?", "Name a primary color.", "What is 2 + 2?",
             "Why is the sky blue?", "Give me a word that rhymes with cat."]
toy = [ToyRequest(name, lm.chat_ids(q), n, at) for name, q, n, at in
       zip("ABCDE", QUESTIONS, [12, 4, 8, 6, 10], [0, 0, 0, 2, 5])]
TOY_SLOTS = 3

# %% [markdown]
# Each sequence owns a slot of the KV cache. In a step, a sequence that has just joined brings
# its whole prompt (prefill, positions `0 .. P-1`); every other one brings the single token it
# produced last step, at the next position (decode). `forward_step` computes all of them in one
# pass and returns the next-token logits of each, in order.

# %%
def step_chunk(req: ToyRequest, slot: int, output: list[int]) -> SeqChunk:
    """What one sequence computes in the next step."""
    if not output:                                      # just joined: the whole prompt
        return SeqChunk(slot, 0, req.prompt_ids, want_logits=True)
    position = len(req.prompt_ids) + len(output) - 1    # decode: the newest token
    return SeqChunk(slot, position, [output[-1]], want_logits=True)

# %% [markdown]
# The loop itself: join, one forward for everyone, leave. Notice that nothing waits for a batch
# to fill or to end.

# %%
def serve_continuously(requests, num_slots: int):
    """Continuous batching by hand. Returns each request's greedy tokens and a log of steps."""
    cache = weights.new_kv_cache(num_slots, max_seq_len=256)
    waiting, running = deque(requests), []              # running: (request, slot) pairs
    free_slots, outputs, log, step = list(range(num_slots)), {r.name: [] for r in requests}, [], 0
    while waiting or running:
        joined = []                                     # 3. waiting requests take free slots
        while waiting and waiting[0].arrives_at_step <= step and free_slots:
            running.append((waiting.popleft(), free_slots.pop(0)))
            joined.append(running[-1][0].name)
        if running:                                     # 1. one forward for every active sequence
            logits = forward_step(weights, cache, [step_chunk(r, s, outputs[r.name]) for r, s in running])
            for (r, _), token in zip(running, logits.argmax(dim=-1).tolist()):
                outputs[r.name].append(token)
            batch = "".join(r.name for r, _ in running)
            done = [(r, s) for r, s in running if len(outputs[r.name]) == r.max_new_tokens]
            running = [pair for pair in running if pair not in done]    # 2. finished ones leave
            free_slots += [s for _, s in done]
            log.append({"step": step, "batch": batch, "joined": "".join(joined),
                        "left": "".join(r.name for r, _ in done)})
        step += 1
    return outputs, pd.DataFrame(log)

# %%
toy_outputs, toy_log = serve_continuously(toy, TOY_SLOTS)
toy_log[(toy_log.joined != "") | (toy_log.left != "")].set_index("step")

# %% [markdown]
# Read the log (only the steps where something changed are shown). A, B and C start together.
# D arrives at step 2 but all three slots are taken; B finishes in step 3, so D joins in step 4,
# the very next step. E arrives at step 5 and takes C's slot the step after C leaves. Meanwhile
# A never stopped: nobody waited for a batch to form or to finish.

# %%
log, arrival = toy_log.set_index("step"), {r.name: r.arrives_at_step for r in toy}
for step, row in log.iterrows():
    for name in row.joined:
        # A request joins in the step it arrives if a slot is free, else right after someone leaves.
        assert step == arrival[name] or log.loc[step - 1, "left"], (step, name)
assert log["batch"].str.len().max() <= TOY_SLOTS
assert log.loc[4, "joined"] == "D" and log.loc[8, "joined"] == "E", log
print(f"{len(log)} steps; every join came on arrival or in the step after a slot was freed")

# %% [markdown]
# Does batching change the answers? The same loop with **one** slot serves the requests one at a
# time, each alone. Greedy decoding picks the most likely token, and the packed step computes
# each sequence's logits from its own tokens only, so in exact arithmetic the answers must be
# identical. Computers round, and how a sum is rounded can depend on the batch's shape: in fp32
# the answers are identical all the same; in bf16 an answer may part from its lone run, but only
# where its two best tokens were nearly tied, within `NEAR_TIE` logits (measured later in this
# notebook). `parted_from_alone` finds where each changed answer parted and how close that was.

# %%
alone_outputs, _ = serve_continuously(toy, num_slots=1)
changed = {name: out for name, out in toy_outputs.items() if out != alone_outputs[name]}
parted = parted_from_alone(weights, {r.name: r.prompt_ids for r in toy}, changed)
expect_same_answers(f"{lm.dtype}: the toy's answers served together against alone", parted,
                    len(toy), exact=EXACT, near_tie=NEAR_TIE)
for name in "AD":   # the first line: requests run to max_new_tokens, past the end of the answer
    print(f"{name}: {lm.decode(toy_outputs[name]).splitlines()[0]!r}")

# %% [markdown]
# ## `batchlab`'s `ContinuousBatcher`
#
# `batchlab.schedulers.ContinuousBatcher` is the same rule with the bookkeeping a real server
# needs (its docstring lists the rules):
#
# - **Budgets.** At most `max_num_seqs` sequences run at once, and one step computes at most
#   `max_num_batched_tokens` tokens (prompt pieces and decodes together; vLLM's
#   `max_num_batched_tokens`). Running sequences' decodes are served first, then prompts.
# - **KV cache.** Here a request joins only if the cache can *reserve* its prompt plus every
#   token it may generate (batchlab's slot cache, the simple first version); otherwise it waits,
#   first come first served. Real servers such as vLLM do not reserve whole lengths: they hand
#   out small blocks of memory as a sequence grows and, when memory runs out, preempt a request
#   and recompute it later. Notebook 05 measures that difference; here memory is ample, so the
#   rule never binds.
# - **Time.** Requests arrive at times in seconds, not at step numbers; the `Engine` runs the
#   steps on a `ModelBackend` and records when every token was made.
#
# The engine's whole job is one short method, `Engine.step`. Read it beside the loop above: the
# scheduler's plan is our "who joins, who decodes", `backend.run` is our `forward_step`, each
# sampled token is appended (and a request that reached its length ends), and `release_ended`
# (the scheduler's `remove_ended`) is our "finished ones leave", which also frees their KV space.

# %%
step_source = inspect.getsource(Engine.step)
print(step_source)
step_lines = [line for line in step_source.splitlines() if line.strip()]
expect("Engine.step reads in one screen (non-blank lines)", len(step_lines), below=21)

# %% [markdown]
# Around the step runs one loop, `run_until` in `batchlab/loop.py`: admit the requests that have
# arrived, step, and when the plan is empty wait for the next arrival or the scheduler's timer.
# Every way of serving runs it; only where requests come from differs. `Engine.run` hands it a
# known workload (on the virtual clock, waiting is a jump to the next arrival), a server hands it
# the requests its HTTP handlers add, and each replica of a cluster (notebook 12) the requests
# its router sends.

# %%
loop_source = inspect.getsource(run_until)
print(loop_source)
expect("the serving loop reads in one screen (non-blank lines)",
       len([line for line in loop_source.splitlines() if line.strip()]), below=36)

# %% [markdown]
# The workload: requests with a 32-token prompt and answers of mixed lengths, arriving as a
# Poisson process. To give the experiment the same meaning on any machine, the rate is a share
# of what this device can do: we time one decode step of a full batch, and from the mean answer
# length work out how many requests per second full batches could serve.

# %%
# NBVAL_IGNORE_OUTPUT
backend = ModelBackend(lm, num_slots=MAX_SEQS, max_seq_len=32 + OUTPUT_LEN.high)
probe_cache = weights.new_kv_cache(MAX_SEQS, max_seq_len=64)
decode_s = time_step(weights, probe_cache, [SeqChunk(s, 48, [42], True) for s in range(MAX_SEQS)])
full_batch_rate = MAX_SEQS / (decode_s * OUTPUT_LEN.mean)     # requests/s with every step full
RATE = 0.6 * full_batch_rate
TIMEOUT = 2 / RATE                                            # dynamic batching: two arrival gaps
workload = make_workload(NUM_REQUESTS, "mixed_output", output_len=OUTPUT_LEN, arrival="poisson",
                         rate=RATE, seed=4, tokenizer=lm.tokenizer)
print(f"decode step of {MAX_SEQS}: {1e3 * decode_s:.0f} ms → full batches serve about "
      f"{full_batch_rate:.2f} req/s; we offer {RATE:.2f} req/s")

# %% [markdown]
# ## Three policies, one workload
#
# The same requests, served by each of three policies on the real model, with the same number of
# slots:
#
# - `StaticBatcher(MAX_SEQS)`: waits for a full batch (or the last stragglers at the end);
# - `DynamicBatcher(MAX_SEQS, TIMEOUT)`: a batch leaves when full or when its oldest request has
#   waited two mean arrival gaps;
# - `ContinuousBatcher(max_num_seqs=MAX_SEQS)`: re-forms the batch every step.
#
# All three **stream**: each token reaches the client the moment it is computed. That way the
# comparison measures scheduling alone. (Servers that batch whole requests are often
# non-streaming too, which makes them look worse still; we add that separately below.)
#
# Each policy serves the workload twice, the policies taking turns (static, dynamic, continuous,
# then back), because the runs follow one another on a machine whose speed can change from one
# minute to the next: a slow moment during one run then weighs half as much in that policy's
# numbers. The pictures show each policy's first run; the checks average its two.

# %%
POLICIES = {
    "static": lambda: StaticBatcher(batch_size=MAX_SEQS, stream=True),
    "dynamic": lambda: DynamicBatcher(max_batch_size=MAX_SEQS, timeout=TIMEOUT, stream=True),
    "continuous": lambda: ContinuousBatcher(max_num_seqs=MAX_SEQS),
}
TURNS = ["static", "dynamic", "continuous", "continuous", "dynamic", "static"]
traces, second_runs = {}, {}
for name in TURNS:
    runs = second_runs if name in traces else traces
    runs[name] = Engine(POLICIES[name](), backend).run(workload, progress=True)

# %% [markdown]
# First, the picture. Each row is a request: gray while it waits, orange for its prefill, blue
# while it decodes. Under static batching whole batches start together (dashed lines) and a
# finished member's slot stays held until its batch ends; under continuous batching every
# request starts soon after it arrives and ends on its own.

# %%
fig, axes = plt.subplots(2, 1, figsize=(10, 9), sharex=True)
plot_timeline(traces["static"], ax=axes[0], title=f"static batching (batch of {MAX_SEQS})")
plot_timeline(traces["continuous"], ax=axes[1], title="continuous batching: join and leave at any step")
fig.tight_layout()
plt.show()

# %% [markdown]
# The device's view: sequences per step over time. Static batching idles while a batch fills,
# then runs it full, and its batch drains as members finish (the red band: slots held by finished
# members). Continuous batching starts work as soon as a request arrives and tops the batch up at
# every step.

# %%
fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
plot_occupancy(traces["static"], ax=axes[0], title="static batching")
plot_occupancy(traces["continuous"], ax=axes[1], title="continuous batching")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## The numbers
#
# `batchlab.analysis.metrics.compare` measures every trace the way a benchmark client would;
# each number below is the mean of the policy's two runs.

# %%
# NBVAL_IGNORE_OUTPUT
COLUMNS = ["ttft_p50", "ttft_p99", "e2e_mean", "e2e_p99", "output_throughput", "busy_share",
           "mean_num_seqs", "slot_waste"]
table = pd.concat([metrics.compare(runs).set_index("policy")[COLUMNS]
                   for runs in (traces, second_runs)]).groupby("policy", sort=False).mean()
table.round(3)

# %%
static, dynamic, continuous = (table.loc[p] for p in ("static", "dynamic", "continuous"))
# First tokens, all three streaming: no waiting for a batch to fill or to start. "Several times
# lower" at the tail, and lower at the median too.
assert continuous.ttft_p99 < min(static.ttft_p99, dynamic.ttft_p99) / 3, table[COLUMNS]
assert continuous.ttft_p50 < min(static.ttft_p50, dynamic.ttft_p50), table[COLUMNS]
# Whole answers: nobody is held by a slower batch mate. (0.85: the runs were measured one
# after another, on a machine whose speed drifts by 10-25% within minutes.)
assert continuous.e2e_mean < 0.85 * min(static.e2e_mean, dynamic.e2e_mean), table[COLUMNS]
# No slot is held by a finished sequence; the request-level batchers hold many.
assert continuous.slot_waste == 0 and static.slot_waste > 0.1 and dynamic.slot_waste > 0.1
# The same requests are done sooner, so throughput over the run is about as high or higher
# (20% slack for the same drift between the runs).
assert continuous.output_throughput >= 0.8 * max(static.output_throughput, dynamic.output_throughput), \
    table[COLUMNS]
print(f"continuous vs static: p99 TTFT {continuous.ttft_p99:.2f} vs {static.ttft_p99:.2f} s, "
      f"mean E2E {continuous.e2e_mean:.2f} vs {static.e2e_mean:.2f} s")

# %% [markdown]
# Why each number moves the way it does:
#
# - **TTFT** (p99 several times lower, with every policy streaming). Static batching makes the
#   early requests of each batch wait for the batch to fill; both request-level batchers make a
#   request that arrives during a batch wait for the whole batch. Under continuous batching a
#   request waits at most for the current step to end (plus its own prefill), as long as a slot
#   is free.
# - **E2E** (mean much lower). A short answer leaves as soon as it is done instead of riding along
#   with the longest answer of its batch.
# - **Slot waste** (zero). A finished sequence's slot is reused at the next step; request-level
#   batching holds it until the batch ends.
# - **Throughput** (about the same, or a little higher). At this load all three eventually
#   serve the same requests as they arrive, so throughput over the run is set mostly by the
#   arrival rate; continuous batching finishes the last requests sooner, which is all the
#   difference. Throughput differences grow when the server is overloaded (notebook 08).
# - **Busy share** (no fixed order, and that is the lesson). It is the share of the run the
#   device spent computing, so it depends on how long each run lasts and how full its steps
#   are. Static batching idles while a batch fills, then runs long, full batches that drag on
#   with held slots; continuous batching starts work the moment a request arrives, with smaller
#   batches (`mean_num_seqs`), and is done soon after the last arrival. Neither number says
#   "efficient": a busy device can be busy with half-empty steps. Continuous batching spends
#   device time to buy latency, the right trade for a live service. At this load every policy
#   leaves the device idle much of the time: spare capacity, which the explorer's rate slider
#   uses up. What *does* say how well a busy device is used are two utilizations: **MBU**
#   (model bandwidth utilization: the bytes a step must read, weights plus KV cache, per second
#   of step, over the device's peak memory bandwidth) and **MFU** (model FLOPs utilization: the
#   step's arithmetic per second over the peak FLOP rate). A decode step at small batch is judged
#   by MBU, a long prefill by MFU; notebook 01 measures both bounds on this machine.

# %% [markdown]
# ## What turning streaming off adds
#
# A request-level batcher that does not stream hands every answer back when its batch ends, so
# its TTFT *is* its E2E: the first token arrives with the last, after the slowest batch mate.
# Streaming does not change the schedule (a finished member's slot is held until the batch ends
# either way), only when the client sees the tokens. So the non-streaming run is the same trace
# delivered differently: `delivered_at_batch_end` moves each response to its batch's end
# (`tests/test_batches.py` checks it against a real non-streaming run, release time for release
# time).

# %%
# NBVAL_IGNORE_OUTPUT
delivery = {f"{name}, streaming": traces[name] for name in ("static", "dynamic")}
delivery |= {f"{name}, at batch end": delivered_at_batch_end(traces[name]) for name in ("static", "dynamic")}
delivery["continuous"] = traces["continuous"]
delivered = metrics.compare(delivery).set_index("policy")
delivered[["ttft_p50", "ttft_p99", "e2e_mean", "e2e_p99"]].round(3)

# %%
for name in ("static", "dynamic"):
    on, off = delivered.loc[f"{name}, streaming"], delivered.loc[f"{name}, at batch end"]
    # Without streaming the first token comes with the last: TTFT grows to E2E's size...
    assert off.ttft_p50 > on.ttft_p50 and off.ttft_p50 == off.e2e_p50, (name, on, off)
    # ...and E2E grows too, since a short answer now waits for its batch's longest one.
    assert off.e2e_mean > on.e2e_mean, (name, on, off)
print("TTFT p50: " + ", ".join(f"{n} {delivered.loc[n].ttft_p50:.2f} s" for n in delivered.index))

# %% [markdown]
# So the gap between continuous and request-level batching has two parts. Scheduling: the wait
# for a batch to fill or to finish, which streaming cannot remove. Delivery: a non-streaming
# server holds every token until the slowest member is done, which adds the batch's whole
# decode time to every first token (how much that is next to the wait depends on the load). A
# benchmark that compares a non-streaming batcher with a streaming one measures both at once;
# say which you measure.
#
# ## Same answers as alone
#
# The batch changes at every step, with prompts of newcomers packed next to other sequences'
# decodes. Does any request's greedy answer change? We re-serve some requests alone (one
# sequence, one slot, nothing else in any step; `parted_from_alone` keeps the logits that chose
# each token) and compare token by token. We pick requests that joined a
# batch already decoding, the case where something could go wrong. What we may assert depends on
# the dtype, for reasons the next section measures: in fp32 the answers must be identical; in
# bf16 or fp16 an answer may change, but only where the lone run's two best tokens were nearly
# tied (within `NEAR_TIE` logits).

# %%
cont = traces["continuous"]
chunks = cont.chunks_df()
first_step = chunks[chunks.kind == "prefill"].groupby("request_id")["step"].min()
company = chunks.groupby("step")["request_id"].count()
joined_busy = [rid for rid, step in first_step.sort_values().items() if company[step] > 1]
by_id = {r.request_id: r for r in workload}
served = {r.request_id: r.output_ids for r in cont.requests}
checked = joined_busy[:CHECK_ALONE]
changed = parted_from_alone(weights, {rid: by_id[rid].prompt_ids for rid in checked},
                            {rid: served[rid] for rid in checked})   # request -> (token, margin)
expect_same_answers(f"{lm.dtype}: requests that joined a running batch, against alone", changed,
                    len(checked), exact=EXACT, near_tie=NEAR_TIE)

# %% [markdown]
# Why only "near-ties" in bf16? Because a batch can change the *bits* of a row's result, though
# not its mathematics: the appendix at the end of this notebook, "Does batching change my
# answer?", shows how on one real weight matrix and measures it on the model in both dtypes.

# %% [markdown]
# ## Explorer: slots and traffic
#
# The simulator runs the same three policies with step times fitted to the steps we just
# measured on the real model (`CostModel.fit` on the three traces: every step is one equation
# "features → measured duration"). That lets us serve hundreds of requests per setting. The
# sliders set the number of slots (`max_num_seqs`, also the batch size of the request-level
# batchers) and the arrival rate.

# %%
# NBVAL_IGNORE_OUTPUT
cost = CostModel.fit([s for t in traces.values() for s in t.steps[1:]],
                     source=f"{lm.name} on {lm.device}, the three traces of notebook 04")
print(cost)
SIM_REQUESTS = 300

# %%
def show_policies(max_num_seqs=MAX_SEQS, rate=round(RATE, 3)):
    """TTFT and E2E distributions of the three policies on the simulator."""
    requests = make_workload(SIM_REQUESTS, "mixed_output", output_len=OUTPUT_LEN,
                             arrival="poisson", rate=rate, seed=5)
    policies = {"static": StaticBatcher(max_num_seqs),
                "dynamic": DynamicBatcher(max_num_seqs, timeout=2 / rate),
                "continuous": ContinuousBatcher(max_num_seqs=max_num_seqs)}
    sims = {name: Engine(policy, SimBackend(cost, kv_capacity_tokens=1 << 20)).run(requests)
            for name, policy in policies.items()}
    p99 = metrics.compare(sims).set_index("policy")["ttft_p99"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    plot_latency_cdf(sims, metric="ttft", unit="s", logx=True, ax=axes[0])
    plot_latency_cdf(sims, metric="e2e", unit="s", logx=True, ax=axes[1])
    fig.suptitle(f"max_num_seqs={max_num_seqs}, {rate:.2f} req/s: p99 TTFT "
                 + ", ".join(f"{k} {v:.2f} s" for k, v in p99.items()))
    fig.tight_layout()
    return fig

# %%
fig = show_policies()
plt.show()

# %%
explore(show_policies, max_num_seqs=(1, 4 * MAX_SEQS),
        rate=(round(0.1 * full_batch_rate, 3), round(1.5 * full_batch_rate, 3),
              round(full_batch_rate / 50, 4)))

# %% [markdown]
# Things to try: raise the rate until continuous batching's TTFT tail grows too (every slot is
# busy and newcomers queue: the limit is now the device, not the policy); lower it to a trickle
# and compare continuous with dynamic batching, which then often sends each request off almost
# alone; give the server more slots and watch which policy profits.
#
# ## Summary
#
# - Continuous batching schedules per step: one forward for every active sequence, finished
#   sequences leave at once, waiting ones join at the next step. By hand it is a 20-line loop;
#   `ContinuousBatcher` adds the token budget, KV admission (here by reserving each request's
#   whole length; notebook 05 shows what memory does to the batch) and the bookkeeping.
# - On the same Poisson workload with mixed answer lengths on the real model, every policy
#   streaming, continuous batching cut the p99 TTFT several times and the mean E2E substantially
#   against both request-level batchers, held no slot for a finished sequence, and served the
#   same work about as fast or faster. The device's busy share ranks nothing by itself: it mixes
#   load, run length and how full the steps are.
# - A non-streaming request-level server adds a second cost on top of scheduling: every token
#   waits for the batch's slowest member, so its TTFT equals its E2E.
# - Does batching change my answer? In fp32 on this CPU, no: every checked request produced
#   exactly the tokens it produces alone, with logits equal to about 10^-4. In bf16 a few answers
#   part ways after some tokens, each at a near-tie, because the kernels' order of additions
#   depends on the batch; batch-invariant modes (vLLM, SGLang) remove that at a speed cost.
# - It is not free: a newcomer's prompt is computed in a step next to everyone else's decode
#   token, and a long one stalls them all for that step. Notebook 06 measures that stall and the
#   cure, chunked prefill.

# %% [markdown]
# ## Exercises
#
# Worked solutions are in `solutions/04_continuous_batching.py`.
#
# **04.1** Five requests are all waiting at step 0 and want `[3, 1, 4, 1, 5]` tokens (the prefill
# step makes the first one). The server has 2 slots and batches continuously, first come first
# served. Give, for each request in order, the step (counting from 0) in which it makes its last
# token. Work it out by hand, then check it with the loop above or with `ContinuousBatcher` on a
# simulator whose steps take 1 s each.

# %%
answer = None  # your code here
check("04.1", answer)

# %% [markdown]
# **04.2** The same five requests under *static* batching with `batch_size=2`. A member that has
# finished keeps its slot until its batch ends. How many slot-steps (slots held for one step) are
# held by finished members over the whole run? Under continuous batching the answer is 0.

# %%
answer = None  # your code here
check("04.2", answer)

# %% [markdown]
# **04.3** Size a server for a latency target. On a simulator with
# `CostModel(fixed_s=0.040, per_seq_s=0.004, per_token_s=0.0006, per_attention_pair_s=2e-8)`,
# serve `make_workload(300, "mixed_output", output_len=Range(4, 48), arrival="poisson", rate=2.0,
# seed=0)` (simulated requests: no tokenizer) with `ContinuousBatcher`. What is the smallest
# `max_num_seqs` from 1 to 16 whose p99 TTFT is at most 1.0 s?

# %%
answer = None  # your code here
check("04.3", answer)

# %% [markdown]
# ## Appendix: does batching change my answer?
#
# In exact arithmetic it cannot: every row of a batched step is computed from its own sequence
# only. But a computer adds in floating point, where `(a + b) + c` and `a + (b + c)` can round
# differently, and a kernel may add a row's terms in another order when the step has another
# number of rows: a matrix-vector routine for one row and a blocked matrix-matrix one for many,
# or, in attention, one sequence's keys alone versus the batch's longest context with a mask.
# Here is one real weight matrix of the model, multiplying one row alone and the same row inside
# a batch of 64:

# %%
def row_alone_vs_in_batch(w, rows: int = 64) -> tuple[float, float]:
    """Share of outputs whose bits differ, and the largest difference relative to the output's scale."""
    x = torch.randn(rows, w.shape[0], generator=torch.Generator().manual_seed(0)).to(w.dtype)
    alone, in_batch = (x[:1] @ w).float(), (x @ w)[:1].float()
    return (alone != in_batch).float().mean().item(), ((alone - in_batch).abs().max() / alone.abs().max()).item()


w_up = weights.layers[0].w_gate_up.cpu()
for name in ("float32", "bfloat16"):
    share, rel = row_alone_vs_in_batch(w_up.to(getattr(torch, name)))
    print(f"{name}: {share:.0%} of outputs differ in their bits, by at most {rel:.1e} of the scale")
    assert rel < (1e-5 if name == "float32" else 1e-2), (name, rel)   # a rounding, nothing more

# %% [markdown]
# Whether the bits differ depends on the device's kernels (on the course's AVX2 CPU torch's fp32
# one-row product differs from the batched one and its bf16 fallback does not; batchlab computes
# bf16 products there in fp32 and rounds the result, the fast route on such a CPU, and attention
# over a batch reads a masked, padded context); the size of the difference depends on the dtype: about one unit in the last place, 2^-24 of the value in fp32,
# 2^-8 in bf16. Through 30 layers such differences reach the logits, and greedy decoding turns
# them into another token wherever the two best tokens are nearly tied. After that, the two
# answers continue from different prefixes.
#
# `batchlab.model.divergence.compare_alone_and_together` measures it on the real model: the same
# chat prompts served each alone and all together in one batch, every step's logits kept. For each
# prompt: the first token that differs, the lone run's margin there (how far its choice beat the
# batch's choice, in logits), and the largest logit difference before that point.

# %%
# NBVAL_IGNORE_OUTPUT
DIVERGE_QUESTIONS = QUESTIONS + ["Explain photosynthesis briefly.", "Write a haiku about rain.",
                                 "What is a prime number?"]
DIVERGE_PROMPTS, DIVERGE_TOKENS = [lm.chat_ids(q) for q in DIVERGE_QUESTIONS], 48
other_dtype = "bfloat16" if lm.dtype == "float32" else "float32"
models = {lm.dtype: weights,
          other_dtype: LlamaWeights.from_hf(load_model(device=lm.device, dtype=other_dtype).model)}
diverge = {dtype: compare_alone_and_together(w, DIVERGE_PROMPTS, DIVERGE_TOKENS)
           for dtype, w in tqdm(models.items(), desc="alone vs together")}
pd.DataFrame({dtype: {"prompts": len(t), "identical": int(t.identical.sum()),
                      "first divergence": t.first_divergence.min(),
                      "largest margin at a divergence": t.tie_margin.max(),
                      "largest logit difference": t.max_logit_diff.max()} for dtype, t in diverge.items()})

# %% [markdown]
# What holds in each dtype, asserted on what was just measured: in fp32 every answer is
# identical and the logits agree to about 10^-4; in bf16 the logits move by up to about a logit
# (a logit near 20 is stored in steps of 0.125, and each layer rounds again), and any answer that
# changed did so at a near-tie: within `NEAR_TIE` (half a logit) of the other token.

# %%
for dtype, t in diverge.items():
    if dtype == "float32":
        assert t.identical.all() and (t.max_logit_diff < 1e-3).all(), t
    else:
        assert (t.tie_margin.dropna() <= NEAR_TIE).all() and (t.max_logit_diff < 3).all(), t
        assert t.max_logit_diff.median() > 100 * diverge["float32"].max_logit_diff.median(), t

# %%
fig, ax = plt.subplots(figsize=(9, 4))
for i, (dtype, t) in enumerate(diverge.items()):
    y = np.arange(len(t)) + 0.4 * i
    parted = int((~t.identical).sum())
    ax.barh(y, t.first_divergence.fillna(DIVERGE_TOKENS), height=0.4,
            label=f"{dtype}: {parted} of {len(t)} answers changed")
    for yi, k, m in zip(y, t.first_divergence, t.tie_margin):
        if pd.notna(k):                                # a divergence: mark its margin
            ax.text(k + 0.5, yi, f"margin {m:.3f}", va="center", fontsize=8)
ax.set(xlabel=f"output tokens identical to the same prompt served alone (of {DIVERGE_TOKENS})",
       ylabel="prompt", title=f"Served in one batch on {lm.device}: fp32 answers stay identical; "
                              "bf16 ones may part ways, only at near-ties")
ax.legend(loc="lower left", fontsize=8)
plt.show()

# %% [markdown]
# What to take from it. Batching is not what changes answers; arithmetic in a dtype whose
# rounding depends on the batch is. In fp32 here the effect stays far below any logit margin; in
# bf16, the dtype GPUs serve in, a few answers in a batch differ from the same request served
# alone, after a few dozen tokens and only at near-ties, so the answers are equally likely ones,
# just not the same bits. If you need the same bits whatever the batch (reproducible evaluations,
# RL rollouts, debugging), servers now offer batch-invariant kernels: vLLM's
# `VLLM_BATCH_INVARIANT=1` (beta, on recent GPUs) and SGLang's `--enable-deterministic-inference`,
# both building on Thinking Machines Lab's batch-invariant operators (He et al., "Defeating
# Nondeterminism in LLM Inference", 2025). They fix one reduction order for every batch size,
# which gives up the fastest kernel for each size: measure the cost before you turn it on.
