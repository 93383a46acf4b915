# %% [markdown]
# # 07 · Measuring TTFT, ITL and tails
#
# "The server is slow" can mean two different things. Either the answer takes a long time to
# *start*, or it starts quickly and then *trickles*. The first is the time to first token
# (TTFT); the second is the inter-token latency (ITL). They have different causes: a late first
# token comes from waiting in the queue and computing the prompt, a slow stream from how many
# tokens per second the decode steps deliver. So before tuning anything, we have to measure the
# right number, and measure it the same way every benchmark tool does... which, it turns out,
# they do not.
#
# This notebook takes one trace of the real model apart by hand, then uses `batchlab.analysis.metrics`
# for the same numbers; it runs the article's two requests (a long prompt with a short answer,
# and the opposite) to see which phase each one stresses; it shows how a mean hides the requests
# people remember; and it ends with goodput, the throughput that met its latency targets.
#
# ## What you will learn
#
# - The four latencies of a streamed response, computed by hand from a token timeline with
#   pandas: **TTFT** (arrival to first token), **E2E** (arrival to last token), **TPOT** (time
#   per output token after the first) and **ITL** (every gap between two tokens), and the same
#   numbers from `batchlab.analysis.metrics`.
# - Why 2,000 tokens in / 20 out and 20 in / 2,000 out, with about the same number of tokens,
#   stress different phases: the first spends its time before the first token, the second after.
# - Means against percentiles: a run where the typical first token comes quickly and one request
#   in a hundred waits many times longer, while the mean still looks fine.
# - Why vLLM, LLMPerf, GuideLLM and AIPerf report different "ITL" numbers for the same run, and which
#   one includes the wait for the first token.
# - **Goodput** under service-level objectives (SLOs), and how two runs with the same
#   throughput can differ in it.

# %% [markdown]
# ## Setup
#
# The real model (SmolLM2-135M-Instruct, fp32 on a CPU, on a GPU if there is one) serves the
# small runs; the simulator, calibrated on the same model, serves the full-scale ones.

# %%
import dataclasses

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from batchlab.analysis import metrics
from batchlab.analysis.claims import expect, expect_close
from batchlab.analysis.diagnosis import token_gaps
from batchlab.analysis.plots import plot_latency_cdf, plot_timeline
from batchlab.analysis.widgets import explore
from batchlab.backends import ModelBackend
from batchlab.sim import SimBackend
from batchlab.experiments.calibration import calibrate_cost_model
from batchlab.engine import Engine
from batchlab.exercises import check
from batchlab.experiments.sweeps import capacity
from batchlab.model import load_model
from batchlab.schedulers import ContinuousBatcher
from batchlab.workloads import make_workload

lm = load_model()
ON_GPU = lm.device == "cuda"
print(f"{lm.name} on {lm.device} ({lm.dtype})")

# %%
# Sizes: the real-model run grows on a GPU; the simulated runs are CPU work either way.
CHAT_REQUESTS = 48 if ON_GPU else 16     # real-model chat run
CHAT_RATE = 8.0 if ON_GPU else 2.0       # its arrival rate (requests/s)
MAX_NUM_SEQS = 16
backend = ModelBackend(lm, num_slots=MAX_NUM_SEQS, max_seq_len=512)


def serve_real(requests, max_num_batched_tokens=512, progress=False):
    """Serve requests on the real model with continuous batching."""
    scheduler = ContinuousBatcher(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=max_num_batched_tokens)
    return Engine(scheduler, backend).run(requests, progress=progress)

# %% [markdown]
# ## A trace, raw
#
# A chat workload (short and medium prompts and answers) arrives as a Poisson stream and is
# served with continuous batching. The engine records, for every output token, when it was
# computed and when the client saw it. With streaming they are the same moment; a non-streaming
# server hands the client everything at the end, and then only `visible_time` is what the client
# experienced. Every latency below is measured from what the client saw.

# %%
# NBVAL_IGNORE_OUTPUT
chat = make_workload(CHAT_REQUESTS, "chat", scale="cpu", arrival="poisson", rate=CHAT_RATE, seed=6,
                     tokenizer=lm.tokenizer)
trace = serve_real(chat, max_num_batched_tokens=256, progress=True)
tokens = trace.tokens_df()
requests = trace.requests_df().set_index("request_id")
tokens.head(6).round(3)

# %%
# NBVAL_IGNORE_OUTPUT
requests[["arrival_time", "prompt_len", "num_output_tokens", "first_token_time",
          "finish_time"]].head(6).round(3)

# %% [markdown]
# The whole run as a timeline: each row a request, grey while it waits, orange while its prompt
# is computed, blue while it decodes.

# %%
plot_timeline(trace, title="The chat run on the real model, request by request")
plt.show()

# %% [markdown]
# Here is one request's life as the client saw it: it arrives, waits, gets its first token, then
# one token after another. The four latencies are distances on this line.

# %%
rid = requests.index[len(requests) // 2]
seen = tokens.loc[tokens["request_id"] == rid, "visible_time"].to_numpy()
arrival = requests.loc[rid, "arrival_time"]
fig, ax = plt.subplots(figsize=(9, 1.8))
ax.vlines(seen, 0, 1, color="#1f77b4", linewidth=1, label="token seen by the client")
ax.axvline(arrival, color="black", linestyle="--", label="arrival")
ax.annotate("", xy=(seen[0], 1.15), xytext=(arrival, 1.15), arrowprops=dict(arrowstyle="<->"))
ax.text((arrival + seen[0]) / 2, 1.25, "TTFT", ha="center")
ax.annotate("", xy=(seen[-1], -0.2), xytext=(arrival, -0.2), arrowprops=dict(arrowstyle="<->"))
ax.text((arrival + seen[-1]) / 2, -0.55, "E2E", ha="center")
ax.set_ylim(-0.8, 1.6)
ax.set_yticks([])
ax.set_xlabel("time (s)")
ax.set_title(f"Request {rid}: {len(seen)} tokens; the gaps between the blue lines are its ITLs")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
plt.show()

# %% [markdown]
# ## The four latencies, by hand
#
# For each request with `n` tokens seen at times `t_1 ... t_n`:
#
# - **TTFT** = `t_1 - arrival`: queueing plus computing the prompt plus the first sampling.
# - **E2E** = `t_n - arrival`: the whole response.
# - **TPOT** = `(E2E - TTFT) / (n - 1)`: the average time per token *after* the first; one
#   number per request (undefined for a one-token answer).
# - **ITL** = every gap `t_{i+1} - t_i`: one number per gap, pooled over all requests, so a
#   long answer contributes many.
#
# With pandas on the token table:

# %%
seen_by_client = tokens.groupby("request_id")["visible_time"]
first, last, n = seen_by_client.min(), seen_by_client.max(), seen_by_client.size()
by_hand = pd.DataFrame({"ttft": first - requests["arrival_time"],
                        "e2e": last - requests["arrival_time"]})
by_hand["tpot"] = (by_hand["e2e"] - by_hand["ttft"]) / (n - 1).where(n > 1)
# ITL: the gaps between successive tokens of each request, pooled.
ordered = tokens.sort_values(["request_id", "token_index"])
itl_by_hand = ordered.groupby("request_id")["visible_time"].diff().dropna().to_numpy()
print(f"{len(by_hand)} requests, {len(itl_by_hand)} token gaps")

# %% [markdown]
# `batchlab.analysis.metrics` computes the same numbers (the way vLLM's serving benchmark does), plus a
# few more per request (`queue_time`, the longest gap `itl_max`). They must agree exactly.

# %%
# NBVAL_IGNORE_OUTPUT
per_request = metrics.per_request_metrics(trace).set_index("request_id")
for col in ("ttft", "e2e", "tpot"):
    assert np.allclose(per_request[col], by_hand.loc[per_request.index, col], equal_nan=True), col
assert np.allclose(np.sort(metrics.itl_values(trace)), np.sort(itl_by_hand)), "ITL differs"
# Pooled ITL weights long answers by their length; the per-request TPOT does not.
print(f"mean of pooled ITL: {itl_by_hand.mean() * 1e3:.1f} ms; "
      f"mean of per-request TPOT: {per_request['tpot'].mean() * 1e3:.1f} ms")

# %%
# NBVAL_IGNORE_OUTPUT
metrics.summarize(trace)[["count", "mean", "p50", "p90", "p99", "max"]].round(3)

# %% [markdown]
# `summarize` is the table a benchmark prints: one row per latency, mean and percentiles.
# `queue_time` (arrival to the first step that computed anything for the request) is something
# only the server knows; a client sees it folded into TTFT.
#
# ## Two requests from the article: 2,000 in / 20 out against 20 in / 2,000 out
#
# Both have about 2,000 tokens. The first is a long document with a short question about it
# (think retrieval-augmented chat): nearly all its work is the prompt, done before the first
# token. The second is a short prompt asking for a long essay: nearly all its work is decoding,
# one token per step, after the first token.
#
# On the CPU we shrink both while keeping their character (`prefill_heavy` is 400 in / 8 out,
# `decode_heavy` 8 in / 160 out at `scale="cpu"`), and serve each alone on the real model.

# %%
def alone(preset, scale, tokenizer=None):
    """One request of a preset, arriving at t = 0."""
    return make_workload(1, preset, scale=scale, arrival="at_once", tokenizer=tokenizer,
                         id_prefix=preset)


def phase_table(traces):
    """Per trace of one request: its lengths, latencies, TTFT's share of E2E, and the time the
    device spent in steps that computed prompt tokens against pure decode steps."""
    rows = {}
    for name, tr in traces.items():
        r = metrics.per_request_metrics(tr).iloc[0]
        steps = tr.steps_df()
        prefill_s = steps.loc[steps["num_prefill_tokens"] > 0, "duration"].sum()
        rows[name] = {"prompt": r["prompt_len"], "output": r["num_output_tokens"], "ttft": r["ttft"],
                      "tpot": r["tpot"], "e2e": r["e2e"], "ttft_share": r["ttft"] / r["e2e"],
                      "prefill_step_share": prefill_s / steps["duration"].sum()}
    return pd.DataFrame(rows).T

# %% [markdown]
# Each request served alone on the real model, and its phases side by side:

# %%
# NBVAL_IGNORE_OUTPUT
real_phases = phase_table({
    "prefill_heavy": serve_real(alone("prefill_heavy", "cpu", lm.tokenizer)),
    "decode_heavy": serve_real(alone("decode_heavy", "cpu", lm.tokenizer), progress=True),
})
real_phases.round(3)

# %%
# NBVAL_IGNORE_OUTPUT
def check_phases(table):
    """The article's claim, as numbers: prefill-heavy spends its time before the first token and
    in prompt steps; decode-heavy after it, in decode steps."""
    pf, dc = table.loc["prefill_heavy"], table.loc["decode_heavy"]
    expect("prefill-heavy: TTFT share of E2E", pf["ttft_share"], above=0.2)
    expect("decode-heavy: TTFT share of E2E", dc["ttft_share"], below=0.05)
    expect("prefill-heavy: share of device time in prompt steps", pf["prefill_step_share"], above=0.2)
    expect("decode-heavy: share of device time in prompt steps", dc["prefill_step_share"], below=0.05)
    expect("TTFT share, prefill-heavy / decode-heavy", pf["ttft_share"] / dc["ttft_share"], above=8)


check_phases(real_phases)

# %% [markdown]
# At full size the real model would take minutes on a CPU, so we use the simulator. First we
# calibrate it: `calibrate_cost_model` serves a short, varied workload on the real model and
# fits a four-term step-time formula (a fixed cost per step, per sequence, per token and per
# attention pair) to the measured steps (10-30 s on a CPU; a few seconds with `reuse=True` when a
# fit stored by an earlier notebook on this machine still predicts fresh steps within 10%). Then
# the article's requests at their real sizes:

# %%
# NBVAL_IGNORE_OUTPUT
cost = calibrate_cost_model(backend, reuse=True)
cost

# %%
# NBVAL_IGNORE_OUTPUT
def sim():
    """A simulated device with this machine's step costs and room for 64 sequences of 4,096."""
    return SimBackend(cost, kv_capacity_tokens=64 * 4096)


def serve_sim(requests, max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=2048):
    scheduler = ContinuousBatcher(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
    return Engine(scheduler, sim()).run(requests)


full_traces = {"prefill_heavy": serve_sim(alone("prefill_heavy", "full")),
               "decode_heavy": serve_sim(alone("decode_heavy", "full"))}
full_phases = phase_table(full_traces)
full_phases.round(3)

# %% [markdown]
# The same claims at full size, and one more: the same number of tokens takes very different
# times, because a decode step computes one token per sequence.

# %%
check_phases(full_phases)
expect("full size: E2E decode-heavy / prefill-heavy",
       full_phases.loc["decode_heavy", "e2e"] / full_phases.loc["prefill_heavy", "e2e"], above=5)

# %% [markdown]
# The prefill-heavy request spends a large share of its life before its first token, and
# the device spends that time in one big prompt step. The decode-heavy request gets its first
# token almost at once and then spends nearly everything decoding, one step per token, each
# step reading all of the model's weights to make a single token: it takes many times longer
# in total. If users complain that answers *start* late, look at prompts and queues; if they
# complain that answers *crawl*, look at decode.
#
# ### As traffic: what each one does to everyone else
#
# Served alone, each request keeps only itself waiting. On a server it shares every step with
# the others. Fifteen chat users start together on the real model; their prompts are computed
# in the first step, and from the second step on all of them are streaming their answers. We
# serve them three times: alone, with a prefill-heavy request arriving during that first step,
# and with a decode-heavy one arriving then. Either newcomer joins at the second step (it
# arrived while the first was running), next to fifteen streams, on any machine.

# %%
CHAT_USERS = MAX_NUM_SEQS - 1                 # room for every chat user and the newcomer


def chat_with(neighbour=None):
    """CHAT_USERS chat requests at t = 0, plus one request of the `neighbour` preset arriving
    1 ms later (during the first step), served on the real model with a budget that holds all
    the chat prompts in the first step."""
    reqs = make_workload(CHAT_USERS, "chat", scale="cpu", arrival="at_once", seed=6, tokenizer=lm.tokenizer)
    if neighbour is not None:
        extra = alone(neighbour, "cpu", lm.tokenizer)[0]
        extra.arrival_time = 1e-3
        reqs = reqs + [extra]
    return serve_real(reqs, max_num_batched_tokens=4096)


neighbours = {"no neighbour": None, "prefill-heavy": "prefill_heavy", "decode-heavy": "decode_heavy"}
traffic = {name: chat_with(preset) for name, preset in tqdm(neighbours.items(), desc="chat runs")}

# %% [markdown]
# For each run: the chat users' gaps between tokens (mean, p99, max); the chat users' worst gap
# ending in the step that first served the neighbour, over their median gap in the same run
# (how hard the neighbour's arrival hit them); and how many steps the neighbour held a place in
# the batch.

# %%
def neighbour_effect(trace, neighbour):
    """The chat users' gaps, and what the request whose id starts with `neighbour` did to them."""
    gaps = token_gaps(trace)
    chat_gaps = gaps[~gaps["request_id"].str.startswith(neighbour or "-")]
    row = {"itl_mean": chat_gaps["gap"].mean(), "itl_p99": chat_gaps["gap"].quantile(0.99),
           "itl_max": chat_gaps["gap"].max()}
    if neighbour is not None:
        held = [s.index for s in trace.steps if any(c.request_id.startswith(neighbour) for c in s.chunks)]
        hit = chat_gaps.loc[chat_gaps["step"] == held[0], "gap"].max()
        row |= {"hit_at_arrival": hit / chat_gaps["gap"].median(), "steps_held": len(held)}
    return row


effects = pd.DataFrame({name: neighbour_effect(traffic[name], preset)
                        for name, preset in neighbours.items()}).T
effects.round(3)

# %%
pf, dc = effects.loc["prefill-heavy"], effects.loc["decode-heavy"]
# The prefill-heavy request hits everyone at once: the step with its prompt freezes every stream...
expect("prefill-heavy neighbour: chat users' gap at its first step / their median gap",
       pf["hit_at_arrival"], above=4)
# ...the decode-heavy one barely: its first step carries a prompt of a few tokens, so the hit is a
# small fraction of the prefill-heavy one's (one step's gap: a busy machine can stretch it)...
expect("decode-heavy neighbour's hit / the prefill-heavy one's", dc["hit_at_arrival"] / pf["hit_at_arrival"],
       below=1 / 3)
# ...but it stays in the batch, one token per step, many times as long.
expect("steps in the batch, decode-heavy / prefill-heavy", dc["steps_held"] / pf["steps_held"], above=10)
# And the means hide the freeze: the chat users' mean gap stays far below their worst one.
expect("prefill-heavy neighbour: chat users' worst gap / mean gap", pf["itl_max"] / pf["itl_mean"], above=3)

# %% [markdown]
# The two requests stress the server in different phases, and so they hurt others differently.
# The prefill-heavy one costs a burst of work in a single step: every user who is streaming at
# that moment sees their text stop for several of their usual gaps (notebook 06 takes this
# apart and cures it with chunked prefill). The decode-heavy one costs a little in every step,
# for a long time: on this CPU each sequence in a step adds its own share of the step's time, so
# the others' gaps grow a little while it runs; on a GPU, where a decode step of a few more
# sequences costs about the same, the larger cost is that it holds its place in the batch and
# its KV cache for all those steps, room that queued requests wait for when memory caps the
# batch (notebook 05). And a dashboard that shows only the mean gap would have shown none of the
# freeze.
#
# ## Means hide tails
#
# The article's warning: if most requests finish in a second and a few take ten, users remember
# the few. Let's make such a run. Traffic on a real service comes in clumps, so we send chat
# requests at full size with bursty arrivals at half of what the server can sustain: on average
# it has plenty of room, but the bursts queue. Two words for that sentence, both used again in
# notebook 08:
#
# - **Burstiness** `b`: the gaps between arrivals are drawn from a gamma distribution with the
#   mean gap `1 / rate` and a coefficient of variation (standard deviation over mean) of
#   `1 / sqrt(b)`. `b = 1` is a Poisson process, independent clients; `b = 0.2` packs the same
#   requests into clumps separated by silences.
# - **Capacity**: the most requests per second the server can finish. `capacity(...)` measures
#   it by sending every request at once, so the server never idles, and counting finished
#   requests per second.

# %%
# NBVAL_IGNORE_OUTPUT
def chat_at(rate, burstiness, n=600):
    """The same chat requests (full size) at `rate`; burstiness 1 is Poisson, smaller clumpier."""
    arrival = "poisson" if burstiness == 1 else "gamma"
    extra = {} if burstiness == 1 else {"burstiness": burstiness}
    return make_workload(n, "chat", scale="full", arrival=arrival, rate=rate, seed=6, **extra)


chat_capacity = capacity(chat_at(1.0, 0.2, n=160), lambda: ContinuousBatcher(MAX_NUM_SEQS, 512), sim)
bursty = serve_sim(chat_at(0.5 * chat_capacity, 0.2), max_num_batched_tokens=512)
ttft = metrics.per_request_metrics(bursty)["ttft"]
tails = pd.Series({"mean": ttft.mean(), "p50": ttft.median(), "p90": ttft.quantile(0.9),
                   "p99": ttft.quantile(0.99), "max": ttft.max()}, name="TTFT (s)")
print(f"capacity ≈ {chat_capacity:.2f} req/s; served at {0.5 * chat_capacity:.2f} req/s")
tails.round(2)

# %%
# NBVAL_IGNORE_OUTPUT
expect("TTFT p99 / p50: the tail is many times the typical wait", tails["p99"] / tails["p50"], above=5)
expect("TTFT mean / p99: the mean does not show it", tails["mean"] / tails["p99"], below=1 / 3)
slow_share = (ttft > 5 * tails["p50"]).mean()
print(f"{slow_share:.1%} of requests waited more than 5x the median for their first token; "
      f"a user sending 20 requests meets at least one of them with probability "
      f"{1 - (1 - slow_share) ** 20:.0%}")

# %% [markdown]
# The CDF shows the shape: a steep rise (most requests are fast) and a long flat tail.

# %%
ax = plot_latency_cdf({"bursty chat": bursty}, metric="ttft", unit="s", logx=True,
                      title=f"Most first tokens come fast; p99 is {tails['p99'] / tails['p50']:.0f} "
                            "times the median")
for name in ("p50", "mean", "p99"):
    ax.axvline(tails[name], linestyle=":", color="gray")
    ax.text(tails[name], 0.05, f" {name}", rotation=90, fontsize=8)
plt.show()

# %% [markdown]
# ## One run, four tools, four "ITL"s
#
# Tools that all say "inter-token latency" compute different things
# (`metrics.itl_definitions` documents each with the source it follows):
#
# - **vLLM** (`vllm bench serve`): *ITL* is every gap between two successive streamed chunks,
#   pooled (a server that sends one token per chunk makes these the gaps between tokens);
#   *TPOT* is per request `(E2E - TTFT) / (n - 1)`, counting tokens. Neither includes the first
#   token's wait.
# - **LLMPerf**: *inter_token_latency* is per request the sum of all gaps *starting with the
#   wait for the first token*, over the number of tokens: `E2E / n`. It includes TTFT.
# - **GuideLLM**: *inter_token_latency* is per request vLLM's TPOT, but its statistics weight
#   each request by its number of gaps, so its mean equals vLLM's pooled ITL mean when every
#   chunk carries one token; *time_per_output_token* is `E2E / n`, like LLMPerf's, weighted by `n`.

# %%
# NBVAL_IGNORE_OUTPUT
defs = metrics.itl_definitions(trace)
defs[["tool", "reported_as", "includes_first_token", "mean", "p50", "p99"]].round(4)

# %% [markdown]
# The first check below is a finding about this run: how much the first token's wait inflates
# LLMPerf's number. The other three are identities of the definitions, true of every trace
# (GuideLLM's, of every trace streamed one token per chunk); they are checked to show that the
# table computes what the list above says.

# %%
# LLMPerf's number includes the wait for the first token, so it is larger than vLLM's TPOT.
expect("LLMPerf's mean inter_token_latency / vLLM's mean TPOT",
       defs.loc["llmperf_inter_token_latency", "mean"] / defs.loc["vllm_tpot", "mean"], above=1)
# Identity: LLMPerf is E2E / n per request.
assert np.isclose((by_hand["e2e"] / n).mean(), defs.loc["llmperf_inter_token_latency", "mean"])
# Identity (one token per chunk): GuideLLM's weighted mean is vLLM's pooled ITL mean.
assert np.isclose(defs.loc["guidellm_inter_token_latency", "mean"], defs.loc["vllm_itl", "mean"])
# Identity: GuideLLM's time per output token, weighted by n, is total E2E over total tokens.
assert np.isclose(defs.loc["guidellm_time_per_output_token", "mean"], by_hand["e2e"].sum() / n.sum())

# %% [markdown]
# **AIPerf** (NVIDIA's benchmark client, `ai-dynamo/aiperf`, `docs/metrics_reference.md`) adds two:
#
# - *inter_token_latency*: per request `(request_latency - TTFT) / (n - 1)`, one number per
#   request, so the same formula as vLLM's TPOT, reported as "ITL".
# - *inter_chunk_latency*: every gap between two successive response chunks (server-sent
#   events), pooled: vLLM's ITL under another name. It counts chunks, not tokens: when a
#   server packs several tokens into a chunk, it sees fewer, longer gaps.
#
# On a trace a chunk is the set of tokens that became visible at the same moment.

# %%
def aiperf_rows(trace, percentiles=(50, 99)):
    """AIPerf's ITL and inter-chunk latency of a trace, as rows of the definitions table."""
    visible = [np.asarray(r.visible_token_times) for r in trace.requests if r.status == "finished"]
    itl = np.array([(v[-1] - v[0]) / (len(v) - 1) for v in visible if len(v) > 1])
    chunks = [np.unique(v) for v in visible]                 # tokens seen together: one chunk
    icl = np.concatenate([np.diff(c) for c in chunks])
    rows = {}
    for name, reported, formula, values in (
            ("aiperf_inter_token_latency", "inter_token_latency", "(E2E - TTFT) / (n - 1)", itl),
            ("aiperf_inter_chunk_latency", "inter_chunk_latency", "chunk[i+1] - chunk[i], every gap", icl)):
        stats = {f"p{p}": np.percentile(values, p) if len(values) else np.nan for p in percentiles}
        rows[name] = {"tool": "AIPerf", "reported_as": reported, "formula": formula, "includes_first_token": False,
                      "count": len(values), "mean": values.mean() if len(values) else np.nan, **stats}
    return pd.DataFrame(rows).T

# %%
# NBVAL_IGNORE_OUTPUT
all_defs = pd.concat([defs, aiperf_rows(trace)])
all_defs[["tool", "reported_as", "includes_first_token", "count", "mean", "p50", "p99"]]

# %% [markdown]
# Two pairs of names for the same numbers: AIPerf's ITL is vLLM's TPOT, and its inter-chunk
# latency is vLLM's ITL. What differs is what a chunk holds. Here every chunk carried one token,
# so the chunk gaps are the token gaps and there are as many of them as TPOT's tokens minus one.
# The same tokens handed over whole at the end (a non-streaming server) leave both clients with
# no gaps at all, while TPOT, which divides by the token count the server reports, still has a
# value.

# %%
assert np.isclose(all_defs.loc["aiperf_inter_token_latency", "mean"], defs.loc["vllm_tpot", "mean"])
assert all_defs.loc["aiperf_inter_chunk_latency", "count"] == defs.loc["vllm_itl", "count"]
assert np.isclose(all_defs.loc["aiperf_inter_chunk_latency", "mean"], defs.loc["vllm_itl", "mean"])
whole = dataclasses.replace(trace, requests=[dataclasses.replace(r, streamed=False) for r in trace.requests])
whole_defs = pd.concat([metrics.itl_definitions(whole), aiperf_rows(whole)])
assert whole_defs.loc["vllm_itl", "count"] == 0 == whole_defs.loc["aiperf_inter_chunk_latency", "count"]
assert whole_defs.loc["vllm_tpot", "count"] == defs.loc["vllm_tpot", "count"] > 0

# %% [markdown]
# Where the difference is dramatic is the article's prefill-heavy request: 20 output tokens
# after a long prompt. LLMPerf's "ITL" of it is mostly its TTFT spread over 20 tokens, while
# vLLM's TPOT only sees the decode steps. For the decode-heavy request the first token is one
# of 2,000, and the definitions nearly agree. So before comparing "ITL" numbers from two
# reports, check which tool made each.

# %%
# NBVAL_IGNORE_OUTPUT
itl_compare = pd.DataFrame({
    name: {"vllm_tpot": d.loc["vllm_tpot", "mean"],
           "llmperf_itl": d.loc["llmperf_inter_token_latency", "mean"]}
    for name, d in ((k, metrics.itl_definitions(t)) for k, t in full_traces.items())}).T
itl_compare["ratio"] = itl_compare["llmperf_itl"] / itl_compare["vllm_tpot"]
expect("prefill-heavy: LLMPerf ITL / vLLM TPOT", itl_compare.loc["prefill_heavy", "ratio"], above=1.2)
expect("decode-heavy: LLMPerf ITL / vLLM TPOT", itl_compare.loc["decode_heavy", "ratio"], below=1.05)
itl_compare.round(4)

# %% [markdown]
# ## Goodput: throughput that kept its promises
#
# Throughput counts every finished request. A service promises more: say, the first token within
# some time and a steady stream after it. Those promises are **service-level objectives**
# (SLOs), and **goodput** counts only the requests per second that met all of them
# (`metrics.SLO`, `metrics.goodput`).
#
# "Goodput" has two meanings in the literature, and a number means little until you know which:
#
# - **vLLM's benchmark goodput** (`vllm bench serve --goodput`, and `metrics.goodput` here): in
#   one run at one request rate, the requests per second that met *every* SLO. It is a rate of
#   good requests; this notebook uses it, and every goodput printed or plotted below is this one.
# - **DistServe's goodput** (Zhong et al., *DistServe*, OSDI 2024): the *highest request rate*
#   a server can be offered while a target share of requests (for example 90%, the *SLO
#   attainment*) still meets the SLO. It is a capacity, read from a load sweep, not from one run;
#   notebook 08 computes it from its sweep (`metrics.max_rate_meeting_slo`).
#
# They answer different questions: "how many good answers did this run deliver?" against "how
# much traffic can this server take before it breaks its promise for more than one user in ten?"
#
# To make the lesson hold on any device, we state the SLOs in units of this machine's decode
# step for one sequence: the first token within 20 steps' time, and at most 3 steps' time per
# token after it (on the course's CPU roughly a second and a bit over 100 ms: about a reader's
# patience and reading speed).

# %%
# NBVAL_IGNORE_OUTPUT
STEP_S = cost.predict_features(1, 1, 100)      # one decode step of one sequence, short context
SLO_TTFT, SLO_TPOT = 20 * STEP_S, 3 * STEP_S
slo = metrics.SLO(ttft=SLO_TTFT, tpot=SLO_TPOT)
bursty_rates = metrics.throughput(bursty, slo=slo)
print(f"SLO: TTFT <= {SLO_TTFT:.2f} s, TPOT <= {SLO_TPOT * 1e3:.0f} ms")
bursty_rates[["num_finished", "num_good", "request_throughput", "goodput"]]

# %%
# NBVAL_IGNORE_OUTPUT
expect("bursty: goodput / throughput", bursty_rates["goodput"] / bursty_rates["request_throughput"], below=0.95)
# Loosening the TTFT objective can only let more requests meet it, up to all of them.
loosen = [metrics.goodput(bursty, {"ttft": k * SLO_TTFT}) for k in (0.25, 0.5, 1, 2, 4, 1000)]
assert all(a <= b for a, b in zip(loosen, loosen[1:])), loosen
assert np.isclose(loosen[-1], bursty_rates["request_throughput"])
print("goodput as the TTFT objective loosens (req/s):", np.round(loosen, 3).tolist())

# %% [markdown]
# Throughput cannot tell a calm day from a stormy one. Serve the same chat requests at the same
# average rate twice: once with smooth Poisson arrivals, once with the bursts above. Both runs
# finish every request, so their throughputs match; their goodputs do not.

# %%
# NBVAL_IGNORE_OUTPUT
calm = serve_sim(chat_at(0.5 * chat_capacity, 1), max_num_batched_tokens=512)
days = metrics.compare({"calm (Poisson)": calm, "bursty": bursty}, slo=slo, label="traffic")
days["good_share"] = days["num_good"] / days["num_finished"]
days[["traffic", "num_finished", "request_throughput", "goodput", "good_share", "ttft_p99"]].round(3)

# %%
days = days.set_index("traffic")
assert (days["num_finished"] == days["num_requests"]).all(), days     # everyone was served
expect_close("throughput, bursty / calm", days.loc["bursty", "request_throughput"]
             / days.loc["calm (Poisson)", "request_throughput"], 1.0, rel_tol=0.15)
expect("share meeting the SLOs, calm - bursty",
       days.loc["calm (Poisson)", "good_share"] - days.loc["bursty", "good_share"], above=0.1)

# %% [markdown]
# ### Explorer: the SLO decides what "good" means
#
# Move the objectives and the clumping of the traffic (burstiness 1 is Poisson; smaller is
# clumpier; the average rate stays at half the capacity). The left plot shows the TTFT
# distribution and its objective, the right one TPOT and its objective; the title gives goodput
# (vLLM's meaning: good requests per second of this one run).

# %%
explorer_traces = {1.0: calm, 0.2: bursty}   # served traces by burstiness, kept between redraws


def latency_cdfs_with_slo(trace, objective, name, axes):
    """TTFT (left) and TPOT (right) distributions of `trace`, with the objective marked in red."""
    left, right = axes
    plot_latency_cdf({name: trace}, metric="ttft", unit="s", logx=True, ax=left)
    left.axvline(objective.ttft, color="red", linestyle="--", label="TTFT SLO")
    plot_latency_cdf({name: trace}, metric="tpot", unit="ms", ax=right)
    right.axvline(objective.tpot * 1e3, color="red", linestyle="--", label="TPOT SLO")

# %% [markdown]
# The explorer's function serves the traffic (once per burstiness), draws both distributions and
# puts the goodput in the title:

# %%
def show_goodput(ttft_slo_steps=20, tpot_slo_steps=3.0, burstiness=0.2):
    """Goodput of chat traffic at half capacity, for SLOs given in decode steps of this machine."""
    if burstiness not in explorer_traces:
        explorer_traces[burstiness] = serve_sim(chat_at(0.5 * chat_capacity, burstiness),
                                                max_num_batched_tokens=512)
    tr = explorer_traces[burstiness]
    objective = metrics.SLO(ttft=ttft_slo_steps * STEP_S, tpot=tpot_slo_steps * STEP_S)
    rates = metrics.throughput(tr, slo=objective)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    latency_cdfs_with_slo(tr, objective, f"burstiness {burstiness}", axes)
    fig.suptitle(f"goodput {rates['goodput']:.3f} of {rates['request_throughput']:.3f} req/s "
                 f"({rates['num_good']} of {rates['num_finished']} requests met both SLOs)")
    fig.tight_layout()
    return fig


explore(show_goodput, ttft_slo_steps=(2, 100, 2), tpot_slo_steps=(1.0, 10.0, 0.5),
        burstiness=[0.1, 0.2, 0.5, 1.0])

# %%
fig = show_goodput(ttft_slo_steps=20, tpot_slo_steps=3.0, burstiness=0.2)
plt.show()

# %% [markdown]
# ## Summary
#
# - TTFT, E2E, TPOT and ITL are distances on one request's token timeline, measured from its
#   arrival to what the client *saw*. A few lines of pandas compute them; `metrics` agrees.
# - TPOT is one number per request; ITL pools every gap, so long answers weigh more.
# - The article's two requests of ~2,000 tokens behave oppositely: the long prompt spends its
#   life before the first token (prefill), the long answer after it (decode), and takes many
#   times longer in total.
# - Under bursty traffic at half of capacity, the p99 TTFT was many times the median, and the
#   mean hid it. Report p50, p90 and p99, not the mean.
# - "ITL" is not one number: LLMPerf's includes the first token's wait (`E2E / n`), vLLM's does
#   not, GuideLLM weights requests by their length, and AIPerf's is vLLM's TPOT; AIPerf's
#   inter-chunk latency counts chunks, not tokens. Compare like with like.
# - Goodput counts only requests that met their SLOs. The same requests at the same average rate
#   gave the same throughput with calm and with bursty arrivals, but bursts broke many more
#   first-token promises.
#
# Next: notebook 08 turns traffic into a knob and watches which latency climbs first.

# %% [markdown]
# ## Exercises
#
# Each exercise asks for a *function of a trace*; the checker runs it on traces of its own
# (streaming, non-streaming, and with one-token answers) and compares. Worked solutions are in
# `solutions/07_measuring_ttft_itl_and_tails.py`.
#
# **07.1** Write `latencies_by_hand(trace)` returning a DataFrame indexed by `request_id` (finished
# requests only) with columns `ttft`, `tpot` and `e2e`, using only `trace.tokens_df()` and
# `trace.requests_df()`. It must be right for a non-streaming server too (which time did the
# client see?) and give `NaN` TPOT for a one-token answer. Pass the function itself.

# %%
answer = None  # your code here
check("07.1", answer)

# %% [markdown]
# **07.2** Write `llmperf_itl(trace)` returning the mean over finished requests of LLMPerf's
# inter-token latency (seconds), computed from the token table, not with `itl_definitions`.

# %%
answer = None  # your code here
check("07.2", answer)

# %% [markdown]
# **07.3** Write `smallest_ttft_slo(trace, share)`: the smallest TTFT objective (seconds) that at
# least `share` of the finished requests meet (e.g. `share=0.9`). Is it the same as
# `np.percentile(ttft, 90)`? Why not?

# %%
answer = None  # your code here
check("07.3", answer)
