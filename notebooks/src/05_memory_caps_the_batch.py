# %% [markdown]
# # 05 · The memory that caps the batch
#
# Continuous batching (notebook 04) decides *who* runs each step. Memory decides *how many can*.
# Every running sequence keeps the keys and values of all its past tokens in the **KV cache**,
# and a device has only so much memory for it: when the cache is full, a waiting request waits,
# however idle the arithmetic units are. vLLM's founding result is about exactly this: servers
# that reserved each request's whole possible length up front left most of that memory empty
# (the vLLM paper measured only 20-38% of reserved KV memory holding real token states), while
# cutting the cache into small **blocks** handed out as sequences grow (PagedAttention) wastes
# under 4%. This notebook measures both on the real model, and what happens when even blocks run
# out.
#
# ## What you will learn
#
# - How many bytes one token's keys and values take, worked out by hand from the model's shape
#   and checked against the cache, and how many sequences a memory budget holds at a context.
# - Reservation (a slot of the longest allowed length per request, the cache of notebook 04)
#   against **paged** blocks, on the same real-model workload with the same memory: how many
#   sequences run at once, and what share of held memory stores real tokens.
# - **Preemption**: when a running sequence needs a block and none is free, the most recently
#   admitted request gives its blocks back and is computed again later (vLLM's rule). The
#   timeline shows it; the p99 latency shows its cost.
# - **Prefix caching**: requests that share a system prompt reuse its blocks instead of
#   computing them again; the first-token time with and without, on the real model.
# - The knobs a real server has for all this: the memory budget, the block size, the most
#   sequences at once, and how it preempts.

# %% [markdown]
# ## Setup

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from batchlab.analysis import metrics
from batchlab.analysis.claims import expect_same_answers
from batchlab.analysis.kv_usage import kv_usage, stored_share
from batchlab.analysis.plots import plot_timeline
from batchlab.analysis.widgets import explore
from batchlab.backends import ModelBackend
from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.exercises import check
from batchlab.model import load_model
from batchlab.model.divergence import NEAR_TIE, parted_between
from batchlab.model.llama import LlamaWeights
from batchlab.requests import Request, RequestStatus
from batchlab.schedulers import ContinuousBatcher
from batchlab.shapes import load_model_shapes
from batchlab.workloads import Range, make_workload

# %% [markdown]
# The model is loaded once (a few seconds); every section below uses it.

# %%
lm = load_model()
ON_GPU = lm.device == "cuda"
weights = LlamaWeights.from_hf(lm.model)
EXACT = lm.dtype == "float32"   # fp32: the same answers whatever the cache (bf16: notebook 04)
print(f"{lm.name} on {lm.device} ({lm.dtype})")

# %%
NUM_REQUESTS = 64 if ON_GPU else 20         # the real-model workload, all arriving at once
OUTPUT_LEN = Range(8, 96) if ON_GPU else Range(8, 40)
SLOT_LEN = 256                              # the longest request the server accepts (its max_model_len)
BUDGET_TOKENS = 8 * SLOT_LEN                # the KV memory of both caches, in token positions
BLOCK_SIZE = 16                             # vLLM's default
MAX_SEQS = 64                               # high enough that memory, not this knob, caps the batch

# %% [markdown]
# ## Bytes per token, by hand
#
# For every layer and every key/value head, a token stores one key vector and one value vector
# of `head_dim` numbers. So one token costs `2 × layers × kv_heads × head_dim × bytes per
# number`. SmolLM2-135M has 30 layers, 3 KV heads (grouped-query attention: 9 query heads share
# them) and heads of 64 numbers, each 4 bytes in fp32 or 2 in bf16 (this run's dtype is printed
# above):

# %%
cfg = weights.config
bytes_per_number = weights.embed.element_size()                             # 4 in fp32, 2 in bf16
by_hand = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * bytes_per_number
slot_cache = weights.new_kv_cache(num_slots=1, max_seq_len=BLOCK_SIZE)      # room for 16 tokens
paged_cache = weights.new_paged_kv_cache(num_blocks=1, block_size=BLOCK_SIZE)  # one 16-token block
tensor_bytes = {name: c.kv.numel() * c.kv.element_size() for name, c in
                [("slot", slot_cache), ("paged", paged_cache)]}
assert by_hand == 2 * 30 * 3 * 64 * bytes_per_number == slot_cache.bytes_per_token == paged_cache.bytes_per_token
assert tensor_bytes == {"slot": 16 * by_hand, "paged": 16 * by_hand}, tensor_bytes
print(f"{by_hand:,} bytes per token: 16 tokens take {16 * by_hand / 2**20:.2f} MiB in either cache")

# %% [markdown]
# 45 KiB (fp32) or 22.5 KiB (bf16) for one token of a 135M-parameter model. The same sum for larger models comes from
# their shapes, kept with their sources in `batchlab/shapes.json`. Llama-3-8B (32 layers,
# 8 KV heads of 128, bf16) needs 128 KiB per token:

# %%
shapes = load_model_shapes()
for shape in shapes.values():
    print(f"{shape.name:>13}: {shape.bytes_per_token:>7,} B/token ({shape.dtype}); "
          f"source: {shape.source[:60]}…")
llama = shapes["Llama-3-8B"]
assert llama.bytes_per_token == 2 * 32 * 8 * 128 * 2 == 128 * 2**10

# %% [markdown]
# ## How many sequences a budget holds
#
# A budget of `M` bytes holds `M / bytes_per_token` token positions, and at a context of `L`
# tokens per sequence, that many over `L` sequences at once (in whole blocks of 16). Say a GPU
# leaves 40 GiB for the cache after the weights (an 80 GB card running an 8B model in bf16):

# %%
budgets = {"SmolLM2-135M": 1 * 2**30, "Llama-3-8B": 40 * 2**30}
rows = [{"model": name, "budget GiB": budgets[name] / 2**30, "context": L,
         "tokens held": shapes[name].kv_tokens(budgets[name]),
         "sequences at once": shapes[name].max_concurrency(budgets[name], L, BLOCK_SIZE)}
        for name in budgets for L in (512, 2048, 8192)]
capacity = pd.DataFrame(rows)
capacity

# %%
assert llama.kv_tokens(40 * 2**30) == 40 * 2**30 // 2**17 == 327_680
assert capacity.set_index(["model", "context"]).loc[("Llama-3-8B", 2048), "sequences at once"] == 160
print("Llama-3-8B, 40 GiB: 327,680 tokens: 640 sequences of 512, 160 of 2,048, 40 of 8,192")

# %% [markdown]
# Memory, not arithmetic, sets the batch: at 8k tokens of context the same GPU runs 40
# sequences at once, whatever its compute could do. Every token a cache reserves but never
# fills lowers that number further, which is the next section.
#
# ## Reservation against paged blocks, on the real model
#
# Two caches with the same memory, `BUDGET_TOKENS` token positions (8 × 256):
#
# - the **slot** cache of notebook 04: one slot of `SLOT_LEN` = 256 tokens per request, the
#   longest request this server accepts, so 8 requests at a time;
# - a **paged** cache: 128 blocks of 16 tokens. A request gets blocks for its prompt when it is
#   admitted and one more block every 16 tokens it generates.
#
# The same `ContinuousBatcher` serves both (`batchlab.kv_blocks` has the block accounting; the
# scheduler asks the cache "can this request grow by n tokens?" before every step). Every
# request arrives at once, so memory is all that limits the batch.

# %%
workload = make_workload(NUM_REQUESTS, "mixed_output", output_len=OUTPUT_LEN, arrival="at_once",
                         seed=5, tokenizer=lm.tokenizer)
slot_backend = ModelBackend(lm, num_slots=BUDGET_TOKENS // SLOT_LEN, max_seq_len=SLOT_LEN)
paged_backend = ModelBackend(lm, max_seq_len=SLOT_LEN, paged=True, block_size=BLOCK_SIZE,
                             num_kv_blocks=BUDGET_TOKENS // BLOCK_SIZE)
assert slot_backend.kv.total_bytes == paged_backend.kv.total_bytes
traces = {"slot": Engine(ContinuousBatcher(MAX_SEQS), slot_backend).run(workload, progress=True),
          "paged": Engine(ContinuousBatcher(MAX_SEQS), paged_backend).run(workload, progress=True)}

# %% [markdown]
# `batchlab.analysis.kv_usage` reads back, step by step, how many tokens each request in flight had
# stored, and what each cache held for it: a whole slot, or whole blocks.

# %%
usage = {"slot": kv_usage(traces["slot"], BLOCK_SIZE, slot_len=SLOT_LEN),
         "paged": kv_usage(traces["paged"], BLOCK_SIZE)}
share = {"slot": stored_share(usage["slot"], "slot_tokens"),
         "paged": stored_share(usage["paged"], "paged_tokens")}
concurrency = {k: metrics.mean_batch_occupancy(t) for k, t in traces.items()}
for k in traces:
    print(f"{k:>5}: {concurrency[k]:4.1f} sequences per step on average, "
          f"{share[k]:.0%} of held memory stored real tokens, peak {usage[k].num_seqs.max()} in flight")

# %%
fig, ax = plt.subplots(figsize=(10, 3.5))
for k, u in usage.items():
    held = u.slot_tokens if k == "slot" else u.paged_tokens
    ax.step(u.start, held, where="post", label=f"{k}: held")
    ax.step(u.start, u.stored_tokens, where="post", linestyle="--", label=f"{k}: stored")
ax.axhline(BUDGET_TOKENS, color="gray", linewidth=0.8)
ax.set(xlabel="time (s)", ylabel="KV token positions",
       title=f"Same memory: slots store {share['slot']:.0%} real tokens, blocks {share['paged']:.0%}")
ax.legend(ncol=2, fontsize=8)
plt.show()

# %%
assert concurrency["paged"] > 1.8 * concurrency["slot"], concurrency
assert share["slot"] < 0.25 and share["paged"] > 0.8, share
assert usage["paged"].paged_tokens.max() <= BUDGET_TOKENS        # never more than the budget
print(f"paged ran {concurrency['paged'] / concurrency['slot']:.1f}x the sequences per step")

# %% [markdown]
# The slot cache held 256 positions for requests that never pass about 80 tokens: only about a
# fifth of its memory held real keys and values, a little under the vLLM paper's 20-38% for
# systems that reserve the longest length (its requests were longer). Blocks waste at most part
# of one block per sequence; with this workload's short sequences (50-80 tokens, 3-5 blocks) that
# part is a larger share than the paper's under 4% for sequences of hundreds of tokens, but paging
# still ran about twice as many sequences per step in the same memory.
#
# Same answers? Paging changes where keys and values live, not what they are. In fp32 every
# request's greedy tokens must be the same under both caches. In bf16 the two runs batch the
# requests differently (the paged one runs more at once), and notebook 04 showed what that allows:
# an answer may part from the same request served alone, only where its two best tokens were
# nearly tied. `parted_between` finds the requests whose answers differ between the runs and
# measures, against each served alone, where and how close to a tie they parted.

# %%
tokens = {k: {r.request_id: r.output_ids for r in t.requests} for k, t in traces.items()}
prompts = {r.request_id: r.prompt_ids for r in workload}
parted = parted_between(weights, prompts, {k: tokens[k] for k in ("slot", "paged")})
expect_same_answers(f"{lm.dtype}: answers with slots and with blocks", parted, len(workload),
                    exact=EXACT, near_tie=NEAR_TIE)

# %%
# NBVAL_IGNORE_OUTPUT
table = metrics.compare(traces).set_index("policy")
table[["output_throughput", "ttft_p50", "ttft_p99", "e2e_p99", "mean_num_seqs"]].round(3)

# %% [markdown]
# ## When memory runs out: preemption
#
# Blocks are handed out as requests grow, so admission is a bet: the cache admits requests
# whose prompts fit now, and they may all want a new block later. When a running request needs
# a block and none is free, `ContinuousBatcher` does what vLLM's scheduler does: the most
# recently admitted running request is **preempted**. Its blocks are freed, it goes back to the
# front of the waiting queue, and when there is room again its prompt *and the tokens it has
# already generated* are computed again in one prefill (its client keeps the tokens it already
# has). The trace records every preemption: who, when, how many tokens to recompute.
#
# The same workload with a third of the memory:

# %%
TIGHT_BLOCKS = BUDGET_TOKENS // BLOCK_SIZE // 3
tight_backend = ModelBackend(lm, max_seq_len=SLOT_LEN, paged=True, block_size=BLOCK_SIZE,
                             num_kv_blocks=TIGHT_BLOCKS)
traces["paged, 1/3 memory"] = Engine(ContinuousBatcher(MAX_SEQS), tight_backend).run(workload, progress=True)
tight = traces["paged, 1/3 memory"]
tight.preemptions_df().head()

# %%
stats = metrics.preemption_stats(tight)
print(stats)
fig, ax = plt.subplots(figsize=(10, 6))
plot_timeline(tight, ax=ax, title=f"{stats['num_preemptions']} preemptions (x): blocks freed, "
              "work redone later (the second orange bar)")
row_of = {r.request_id: i for i, r in enumerate(sorted(tight.requests, key=lambda r: r.arrival_time))}
ax.scatter([p.time for p in tight.preemptions], [row_of[p.request_id] for p in tight.preemptions],
           marker="x", color="red", zorder=5, label="preempted")
ax.legend(loc="lower right", fontsize=8)
plt.show()

# %% [markdown]
# What did it cost? Every request arrived at t = 0, so its end-to-end latency can be counted in
# steps: the number of the step that made its last token. That count does not depend on how
# fast this machine was during each run (the schedule depends only on the requests and the
# memory), so it compares the two runs exactly; the seconds are printed beside it.

# %%
def e2e_steps(trace) -> np.ndarray:
    """Per request: how many steps ran from its arrival to its last token (inclusive)."""
    ends = np.array([s.end for s in trace.steps])
    first = np.searchsorted(ends, [r.arrival_time for r in trace.requests], "right")
    last = np.searchsorted(ends, [r.token_times[-1] for r in trace.requests])
    return last + 1 - first


p99_steps = {k: np.percentile(e2e_steps(traces[k]), 99) for k in ("paged", "paged, 1/3 memory")}
p99_s = {k: metrics.summarize(traces[k]).loc["e2e", "p99"] for k in p99_steps}
assert stats["num_preemptions"] >= 3 and stats["recomputed_tokens"] > 0, stats
tight_tokens = {r.request_id: r.output_ids for r in tight.requests}
assert all(r.status is RequestStatus.FINISHED for r in tight.requests)          # nothing lost
assert {k: len(v) for k, v in tight_tokens.items()} == {k: len(v) for k, v in tokens["slot"].items()}
changed = parted_between(weights, prompts, {"ample": tokens["paged"], "tight": tight_tokens})
preempted = {p.request_id for p in tight.preemptions}
expect_same_answers(f"{lm.dtype}: answers with ample and with a third of the memory", changed,
                    len(workload), exact=EXACT, near_tie=NEAR_TIE)
assert p99_steps["paged, 1/3 memory"] > 1.3 * p99_steps["paged"], p99_steps
assert tight_backend.kv.used_blocks == 0   # every block came back
for k in p99_steps:
    print(f"{k:>17}: p99 E2E {p99_steps[k]:.0f} steps ({p99_s[k]:.2f} s)")
print(f"{stats['recomputed_tokens']} tokens computed twice; {len(changed.keys() & preempted)} of "
      f"{len(preempted)} preempted and {len(changed.keys() - preempted)} other requests got different "
      f"tokens ({lm.dtype})")

# %% [markdown]
# With a third of the memory, the slowest requests needed more steps: at the p99, more than 1.3
# times as many (the counts are printed above). In seconds the gap is smaller, because the tight run's steps carry fewer sequences and are
# shorter; but every one of those extra steps is work a larger cache would not have done.

# %% [markdown]
# Every request still finished with all its tokens. In fp32 they are the very tokens it got with
# ample memory: the recomputed keys and values equal the first ones. In bf16 they need not be, for
# two reasons: the recompute is one prefill over the prompt and the generated tokens, which rounds
# differently from the one-token decode steps that first computed them; and with less memory every
# step holds other requests, which on a CPU whose kernels tile rows together (oneDNN's AMX kernels)
# moves the rounding of every row. Either way an answer can change only at a near-tie (notebook
# 04), which is what the check above asks in bf16; the line printed after it counts how many of
# the changed requests were preempted.
#
# A preempted request loses time twice: it waits while others run, and then its tokens are
# computed again. Servers set knobs to keep this rare: a larger memory budget
# (`gpu_memory_utilization` in vLLM), fewer sequences at once (`max_num_seqs`), or keeping some
# blocks free at admission (`reserve_blocks` here, the "watermark" of vLLM's first scheduler).
# vLLM counts preemptions in its metrics (its first scheduler also logged a warning for each),
# because they mean the server is running past its memory.
#
# ## Prefix caching: a shared system prompt
#
# Many requests to one service start with the same system prompt. Its keys and values are the
# same for every request (they depend only on the tokens before them), so there is no need to
# compute them again. With prefix caching (`enable_prefix_caching=True`), every *full* block of a
# prompt is named by a hash of its tokens chained onto the hash of the block before it, so a
# block matches only if the whole prefix up to it matches. A new request that starts with cached
# blocks takes them (counting references) and computes only the rest. Blocks nobody uses stay
# cached until the space is needed, and the least recently used go first. vLLM's current engine
# (V1) has prefix caching on by default (`--no-enable-prefix-caching` turns it off), as it has
# chunked prefill; batchlab's caches leave it off unless asked, so that a lesson can show both.
#
# Four requests with the same 256-token system prompt and different questions, each served alone:

# %%
system = make_workload(1, prompt_len=256, output_len=1, arrival="at_once", seed=9,
                       tokenizer=lm.tokenizer)[0].prompt_ids
QUESTIONS = ["What is the capital of France?", "Name a primary color.", "What is 2 + 2?",
             "Why is the sky blue?"]
shared = [Request(f"q{i}", system + lm.chat_ids(q), 8, arrival_time=30.0 * i)
          for i, q in enumerate(QUESTIONS)]
prefix_traces = {}
for on in (False, True):
    backend = ModelBackend(lm, max_seq_len=512, paged=True, num_kv_blocks=256, enable_prefix_caching=on)
    prefix_traces[on] = Engine(ContinuousBatcher(8), backend).run(shared)
hits = backend.kv.num_hit_tokens

# %%
# NBVAL_IGNORE_OUTPUT
ttft = pd.DataFrame({("on" if on else "off"): metrics.per_request_metrics(t).set_index("request_id")["ttft"]
                     for on, t in prefix_traces.items()})
ttft["cut"] = ttft["off"] / ttft["on"]
ttft.round(3)

# %%
later = ttft.iloc[1:]                      # the first request fills the cache; the rest hit it
assert hits >= 256 * (len(shared) - 1), hits   # the chat template's opening is shared too
assert later["cut"].median() > 2.5, ttft
answers = {("on" if on else "off"): {r.request_id: r.output_ids for r in t.requests}
           for on, t in prefix_traces.items()}
parted = parted_between(weights, {r.request_id: r.prompt_ids for r in shared}, answers)
expect_same_answers(f"{lm.dtype}: answers with prefix caching off and on", parted, len(shared),
                    exact=EXACT, near_tie=NEAR_TIE)
print(f"requests 2-{len(shared)} reused at least 256 cached tokens: "
      f"TTFT {later['off'].median() * 1e3:.0f} → "
      f"{later['on'].median() * 1e3:.0f} ms (median)")

# %% [markdown]
# The first request pays for the system prompt; every later one computes only its own question
# (plus the part of the prompt's last block that is not full), so its first token comes several
# times sooner, with the same answers (in bf16: the same, or parted at a near-tie).
#
# ## Explorer: memory budget and block size
#
# The simulator keeps the same accounting (blocks, growth, preemption, prefix hits), with step
# times from a cost model fitted to the real steps above. The sliders set the memory budget and
# the block size; the same 200 requests are served with slots (reserving 256 tokens each) and
# with blocks.

# %%
# NBVAL_IGNORE_OUTPUT
cost = CostModel.fit([s for t in traces.values() for s in t.steps[1:]],
                     source=f"{lm.name} on {lm.device}, the runs of notebook 05")
sim_requests = make_workload(200, "mixed_output", output_len=OUTPUT_LEN, arrival="poisson",
                             rate=4 * NUM_REQUESTS / traces["slot"].duration, seed=6)
print(cost)

# %%
def memory_titles(sims: dict) -> tuple[str, str]:
    """The two panels' findings, read from the runs they draw (slots first, then blocks)."""
    (_, slots), (_, blocks) = sims.items()
    seqs = [metrics.mean_batch_occupancy(t) for t in (slots, blocks)]
    e2e = [metrics.per_request_metrics(t)["e2e"].median() for t in (slots, blocks)]
    fit = "blocks fit more sequences per step" if seqs[1] > seqs[0] else "blocks fit no more sequences per step"
    end = ("and finish them sooner (median E2E)" if e2e[1] < e2e[0]
           else "but finish them no sooner (median E2E): preemptions cost more than they gain")
    return fit, end

# %% [markdown]
# The picture: each cache's sequences per step over time, and how long requests took end to end
# (with each cache's preemptions in the legend).

# %%
def show_memory(budget_tokens=BUDGET_TOKENS, block_size=BLOCK_SIZE):
    """Sequences per step and E2E of slots against blocks for one budget."""
    slots = max(1, budget_tokens // SLOT_LEN)
    runs = {f"slots ({slots} x {SLOT_LEN})": SimBackend(cost, slots * SLOT_LEN, max_seq_len=SLOT_LEN),
            f"blocks of {block_size}": SimBackend(cost, budget_tokens, max_seq_len=SLOT_LEN,
                                                  block_size=block_size)}
    sims = {k: Engine(ContinuousBatcher(MAX_SEQS), b).run(sim_requests) for k, b in runs.items()}
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.5))
    for k, t in sims.items():
        steps = t.steps_df()
        axes[0].step(steps.start, steps.num_seqs, where="post", label=k)
        axes[1].ecdf(metrics.per_request_metrics(t)["e2e"], label=f"{k}: {len(t.preemptions)} preemptions")
    axes[0].set(xlabel="time (s)", ylabel="sequences per step", title=memory_titles(sims)[0])
    axes[1].set(xlabel="E2E latency (s)", ylabel="share of requests", title=memory_titles(sims)[1])
    for ax in axes:
        ax.legend(fontsize=8)
    mib = budget_tokens * by_hand / 2**20
    fig.suptitle(f"KV budget {budget_tokens} tokens ({mib:.0f} MiB of SmolLM2 in {lm.dtype})")
    fig.tight_layout()
    return fig

# %%
fig = show_memory()
plt.show()

# %%
explore(show_memory, budget_tokens=(SLOT_LEN, 16 * SLOT_LEN, SLOT_LEN), block_size=[1, 4, 16, 64, 256])

# %% [markdown]
# Things to try: shrink the budget until blocks preempt (the E2E tail grows); raise the block
# size to 256 (one block per sequence: paging becomes reservation again); give a large budget,
# and the two caches meet, because memory no longer caps the batch.
#
# ## Summary
#
# - One token's KV costs `2 × layers × kv_heads × head_dim × bytes`: 45 KiB for SmolLM2-135M in
#   fp32, 128 KiB for Llama-3-8B in bf16. A budget over that, over the context, is how many
#   sequences run at once: memory caps the batch.
# - Reserving the longest length per request (slots) left about four fifths of the memory empty
#   on the real model; paged blocks stored real tokens in most of theirs and ran about twice the
#   sequences per step in the same memory, with identical greedy answers in fp32 (in bf16,
#   identical or parted from the lone run at a near-tie).
# - When blocks run out, the most recently admitted request is preempted and recomputed: nothing
#   is lost, but the tail latency grows. A real server's knobs: the memory budget, the block
#   size, the most sequences at once, and what it keeps free (or how it preempts).
# - Prefix caching reuses the blocks of a shared prompt: later requests' first tokens came
#   several times sooner, with the same tokens (fp32; bf16 as above).

# %% [markdown]
# ## Exercises
#
# Worked solutions are in `solutions/05_memory_caps_the_batch.py`.
#
# **05.1** Llama-3-70B has 80 layers, 8 KV heads and a head size of 128. How many bytes does one
# token's KV take in bf16 (2 bytes per number)?

# %%
answer = None  # your code here
check("05.1", answer)

# %% [markdown]
# **05.2** With Llama-3-8B's shape (bf16) and a KV budget of 10 GiB in blocks of 16 tokens, how
# many sequences of 3,000 tokens fit at once? (Each sequence needs whole blocks.)

# %%
answer = None  # your code here
check("05.2", answer)

# %% [markdown]
# **05.3** A paged cache of 4 blocks of 4 tokens; every step takes 1 s. Request A (prompt 6
# tokens, 6 new tokens) and request B (prompt 2 tokens, 10 new tokens) both arrive at t = 0, A
# first. Under `ContinuousBatcher` (budget large enough for both prompts), which request is
# preempted, at what time, and when does each finish? Give a dict
# `{"preempted": ..., "at": ..., "A": ..., "B": ...}`. Work it out by hand, then check it on
# `SimBackend(..., block_size=4)`.

# %%
answer = None  # your code here
check("05.3", answer)
