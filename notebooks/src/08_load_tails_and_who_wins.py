# %% [markdown]
# # 08 · Load, tails, and who wins
#
# Every earlier notebook served one workload at one traffic level. A real server does not get to
# choose: traffic is light at night and heavy at peak hour, and it comes in clumps. This notebook
# turns traffic into a knob. We serve the *same* requests at rising request rates, with smooth
# (Poisson) and clumpy (bursty) arrivals, under dynamic and continuous batching, and watch what
# climbs first.
#
# Hundreds of requests at a dozen rates is far beyond what a CPU can serve with the real model in
# a minute, so the sweeps run on the simulator, with step times fitted to the real model on this
# machine; then we check the simulator against the real model at a few points.
#
# At the end we test a claim from the course's article: at low traffic, request-level dynamic
# batching can give a faster first token than continuous batching. We look for the conditions
# under which that is true, and the ones under which it is not.
#
# ## What you will learn
#
# - A **load sweep**: the same requests served at several request rates, written out in a few
#   lines, and `batchlab.experiments.sweeps.load_sweep`, which does the same for several policies at once.
# - **Poisson and bursty arrivals**: the same average rate with different clumping (gamma
#   gaps, `burstiness < 1`), and what clumping does to tail latency.
# - **TTFT climbs first**: as traffic approaches what the server can do, waiting in the queue
#   makes the time to first token (p99) grow many times over, while the inter-token latency
#   (p50) grows a little.
# - **Goodput**: requests per second that meet a latency target, and where each policy's peaks.
# - How far the simulator can be trusted: calibrated on the real model, then spot-checked.
# - **Who gives the first token sooner**, continuous or dynamic batching: the mechanism, a map
#   of where each wins, and the conditions, asserted.

# %% [markdown]
# ## Setup
#
# We load the model, measure its step costs (`calibrate_cost_model` serves a short, varied
# workload on the real model and fits the simulator's four-term cost formula to the measured
# steps; up to half a minute on a CPU), and build simulator backends whose KV cache is the size
# of the real backend's.

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from batchlab.analysis import metrics
from batchlab.analysis.plots import plot_load_curve, plot_timeline
from batchlab.analysis.widgets import explore
from batchlab.backends import ModelBackend, SimBackend
from batchlab.backends.calibration import calibrate_cost_model
from batchlab.backends.cost_model import CostModel, features_df
from batchlab.engine import Engine
from batchlab.exercises import check
from batchlab.experiments.sweeps import capacity, load_sweep
from batchlab.model import load_model
from batchlab.plan import chunk_attention_pairs
from batchlab.schedulers import ContinuousBatcher, DynamicBatcher
from batchlab.workloads import make_workload
from batchlab.workloads.scripted import scripted_workload

lm = load_model()
ON_GPU = lm.device == "cuda"
print(f"{lm.name} on {lm.device} ({lm.dtype})")

# %%
# Sizes. The simulator's sweeps are CPU work either way; a GPU only makes the real-model check bigger.
MAX_NUM_SEQS = 16            # sequences a policy may run at once (KV slots)
MAX_SEQ_LEN = 512            # tokens per slot: prompt + output of one request
SWEEP_REQUESTS = 600         # requests per simulated run of the load sweeps
MAP_REQUESTS = 100           # requests per cell of the who-wins map (medians need fewer)
SPOT_REQUESTS = 24 if ON_GPU else 8   # requests per real-model run of the spot check

backend = ModelBackend(lm, max_num_seqs=MAX_NUM_SEQS, max_seq_len=MAX_SEQ_LEN)


def sim(cost_model=None):
    """A fresh simulator backend with the real backend's KV cache size (and the fitted `cost`)."""
    return SimBackend(cost_model or cost, kv_capacity_tokens=MAX_NUM_SEQS * MAX_SEQ_LEN,
                      max_seq_len=MAX_SEQ_LEN)

# %%
# NBVAL_IGNORE_OUTPUT
cost = calibrate_cost_model(backend)
print(cost)
if cost.fit_stats["median_rel_error"] > 0.15:
    print("Warning: the fit is poor, so other programs were probably competing for the CPU; the "
          "real-model check at the end needs a quiet machine.")
# One decode step of one sequence with 64 tokens of context: the basic unit of time on this machine.
DECODE_STEP = cost.predict_features(1, 1, 65)
PREFILL_256 = cost.predict_features(1, 256, chunk_attention_pairs(0, 256))
print(f"a decode step at batch 1: {DECODE_STEP * 1e3:.1f} ms; "
      f"a 256-token prompt in one step: {PREFILL_256 * 1e3:.0f} ms")

# %% [markdown]
# The two policies, configured as a server would be for chat. Dynamic batching streams its
# tokens (`stream=True`), so its time to first token means the same as continuous batching's:
# when the client sees the first token, not when the whole answer is done.
#
# Timeouts and latency targets are set in units of `DECODE_STEP`, so they mean the same thing on
# a fast or a slow machine: a dynamic batch waits at most one decode step for company, and a
# request is "good" if its first token comes within 20 decode steps and the rest stream at no
# worse than one token per 2.5 decode steps.

# %%
# NBVAL_IGNORE_OUTPUT
CHAT_TIMEOUT = round(DECODE_STEP, 4)
CHAT_BUDGET = 256            # tokens per continuous-batching step: chat prompts fit in one step
chat_policies = {
    "dynamic": lambda: DynamicBatcher(max_batch_size=MAX_NUM_SEQS, timeout=CHAT_TIMEOUT, stream=True),
    "continuous": lambda: ContinuousBatcher(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=CHAT_BUDGET),
}
SLO_CHAT = metrics.SLO(ttft=round(20 * DECODE_STEP, 3), tpot=round(2.5 * DECODE_STEP, 4))
print(f"dynamic timeout {CHAT_TIMEOUT * 1e3:.0f} ms; SLO: TTFT <= {SLO_CHAT.ttft} s, "
      f"TPOT <= {SLO_CHAT.tpot * 1e3:.0f} ms")

# %% [markdown]
# ## Traffic with the same rate and different clumping
#
# `make_workload(..., arrival="gamma", rate=r, burstiness=b)` draws the gaps between arrivals from
# a gamma distribution with mean `1 / r`. The *coefficient of variation* of the gaps (standard
# deviation over mean) is `1 / sqrt(b)`: `b = 1` is a Poisson process (independent clients),
# `b < 1` packs requests into bursts separated by long silences. The average rate is the same;
# only the clumping differs. Lengths come from a separate random stream, so every version has the
# very same requests, only moved in time.

# %%
def chat_workload(rate, burstiness=1.0, n=SWEEP_REQUESTS, seed=0):
    """The chat requests of this notebook at `rate` req/s: Poisson (burstiness 1) or gamma gaps."""
    return make_workload(n, "chat", arrival="gamma", rate=rate, burstiness=burstiness, seed=seed)


BURSTY = 0.25
smooth, bursty = chat_workload(1.0), chat_workload(1.0, BURSTY)
for name, reqs, b in (("Poisson", smooth, 1.0), (f"gamma, burstiness {BURSTY}", bursty, BURSTY)):
    gaps = np.diff([r.arrival_time for r in reqs])
    cv = gaps.std() / gaps.mean()
    print(f"{name:>22}: mean gap {gaps.mean():.2f} s, CV of gaps {cv:.2f} (theory {1 / math.sqrt(b):.2f})")
    assert abs(gaps.mean() - 1.0) < 0.25 and abs(cv - 1 / math.sqrt(b)) < 0.25 / math.sqrt(b), (name, cv)
assert [r.prompt_len for r in smooth] == [r.prompt_len for r in bursty], "same requests, moved in time"

# %%
fig, ax = plt.subplots(figsize=(9, 2.4))
for row, (name, reqs) in enumerate((("Poisson", smooth), (f"burstiness {BURSTY}", bursty))):
    times = [r.arrival_time for r in reqs if r.arrival_time < 120]
    ax.eventplot(times, lineoffsets=row, linelengths=0.7, linewidths=0.8)
ax.set_yticks([0, 1], ["Poisson", f"burstiness {BURSTY}"])
ax.set_xlabel("arrival time (s)")
ax.set_title("One request per second on average: the bursty stream comes in clumps")
plt.show()

# %% [markdown]
# ## A load sweep, written out
#
# A load sweep is a loop: for each rate, build the workload at that rate, serve it with a *new*
# scheduler and a *new* backend (both hold state: queues and a KV cache), and keep one row of
# metrics.

# %%
def sweep_by_hand(make_requests, rates, make_scheduler):
    """One row of metrics.summary_row per rate, for one policy, on the simulator."""
    rows = []
    for rate in rates:
        trace = Engine(make_scheduler(), sim()).run(make_requests(rate))
        rows.append({"request_rate": rate, **metrics.summary_row(trace)})
    return pd.DataFrame(rows)


by_hand = sweep_by_hand(chat_workload, [0.5, 1.0], chat_policies["continuous"])
by_hand[["request_rate", "ttft_p50", "ttft_p99", "itl_p50", "busy_share"]].round(3)

# %% [markdown]
# `batchlab.experiments.sweeps.load_sweep(workload_fn, rates, policies, backend_factory, slo=...)` is the same
# loop over several policies, with a progress bar, checks on its inputs, and the policy's name in
# each row: a tidy table that `plot_load_curve` draws directly.

# %%
same = load_sweep(chat_workload, [0.5, 1.0], {"continuous": chat_policies["continuous"]}, sim,
                  progress=False)
for col in ("ttft_p50", "ttft_p99", "itl_p50", "e2e_p90", "busy_share"):
    assert np.allclose(same[col], by_hand[col]), col
print("load_sweep agrees with the hand-written loop")

# %% [markdown]
# ## How much can each policy serve?
#
# Rates only mean something next to what the server can do. `capacity` sends every request at
# once, so the server never idles, and counts finished requests per second. We place the sweep's
# rates as fractions of each policy's capacity (its *load*), which means the same on any machine.

# %%
# NBVAL_IGNORE_OUTPUT
chat_capacity = {name: capacity(chat_workload(1.0), factory, sim) for name, factory in chat_policies.items()}
print({name: f"{c:.2f} req/s" for name, c in chat_capacity.items()})
assert chat_capacity["continuous"] > 1.1 * chat_capacity["dynamic"], chat_capacity

LOAD_FRACTIONS = [0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 0.95, 1.2]
print("loads (share of each policy's capacity):", LOAD_FRACTIONS)

# %% [markdown]
# Continuous batching serves more: its batch is refilled every step, while a dynamic batch runs
# until its longest answer is done and its finished members hold their slots (notebook 03).
#
# ## Sweeping the load: the first token is what suffers
#
# Now the sweep itself. Each policy is swept from 10% to 120% of its *own* capacity, with
# Poisson and with bursty arrivals: 32 runs of 600 requests on the simulator.

# %%
# NBVAL_IGNORE_OUTPUT
sweeps = []
for arrivals, b in (("Poisson", 1.0), (f"bursty ({BURSTY})", BURSTY)):
    for name, factory in chat_policies.items():
        rates = [round(f * chat_capacity[name], 3) for f in LOAD_FRACTIONS]
        df = load_sweep(lambda rate: chat_workload(rate, b), rates, {name: factory}, sim, slo=SLO_CHAT)
        sweeps.append(df.assign(arrivals=arrivals, load=LOAD_FRACTIONS))
load_table = pd.concat(sweeps, ignore_index=True)
load_table["series"] = load_table["policy"] + ", " + load_table["arrivals"]
load_table.pivot_table(index="load", columns="series", values="ttft_p99").round(2)

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 4))
plot_load_curve(load_table, y="ttft_p99", hue="series", ax=axes[0], logy=True,
                title="TTFT p99 climbs steeply toward saturation")
plot_load_curve(load_table, y="itl_p50", hue="series", ax=axes[1],
                title="ITL p50 rises gently")
axes[1].set_ylim(bottom=0)
fig.tight_layout()
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
poisson_table = load_table[load_table["arrivals"] == "Poisson"]
poisson_table.pivot_table(index="load", columns="policy",
                          values=["ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "goodput"]).round(3)

# %% [markdown]
# Why the difference? The inter-token latency is the length of a decode step, and a step for 16
# sequences costs not much more than a step for 1 (notebook 01): more traffic means fuller steps,
# only a little slower. The time to first token also contains the *wait in the queue*, and a queue
# grows without bound as the arrival rate approaches the service rate. At the peak hour the first
# token is what users notice.
#
# The claim, asserted for each policy and arrival process: from 10% to 95% of the policy's
# capacity, TTFT p99 grows by a larger factor than ITL p50.

# %%
# NBVAL_IGNORE_OUTPUT
growth_rows = []
for (policy, arrivals), g in load_table.groupby(["policy", "arrivals"]):
    light, heavy = g.set_index("load").loc[0.1], g.set_index("load").loc[0.95]
    growth_rows.append({"policy": policy, "arrivals": arrivals,
                        "from_rate": light["request_rate"], "to_rate": heavy["request_rate"],
                        "ttft_p99_growth": heavy["ttft_p99"] / light["ttft_p99"],
                        "itl_p50_growth": heavy["itl_p50"] / light["itl_p50"]})
growth = pd.DataFrame(growth_rows)
for _, row in growth.iterrows():
    assert row["ttft_p99_growth"] > 1.25 * row["itl_p50_growth"], row.to_dict()
growth.round(2)

# %% [markdown]
# Bursts hurt the tail. At the same average rate, a clump of arrivals has to queue behind itself,
# so TTFT p99 is worse with bursty traffic; the decode steps, and so the median ITL, change much
# less (a clump makes the batch a little bigger for a while). Checked for continuous batching at
# every load up to 70% of its capacity:

# %%
# NBVAL_IGNORE_OUTPUT
cont = load_table[(load_table["policy"] == "continuous") & (load_table["load"] <= 0.7)]
poisson = cont[cont["arrivals"] == "Poisson"].set_index("load")
clumpy = cont[cont["arrivals"] != "Poisson"].set_index("load")
tail_ratio = clumpy["ttft_p99"] / poisson["ttft_p99"]
itl_ratio = clumpy["itl_p50"] / poisson["itl_p50"]
print("bursty / Poisson, TTFT p99:", tail_ratio.round(2).tolist(), "  ITL p50:", itl_ratio.round(2).tolist())
assert (tail_ratio > 1.2).all(), tail_ratio
assert (tail_ratio > itl_ratio).all(), pd.DataFrame({"ttft_p99": tail_ratio, "itl_p50": itl_ratio})

# %% [markdown]
# ## Goodput: the requests that were worth serving
#
# Throughput counts every finished request; **goodput** counts only those that met the latency
# target (`SLO_CHAT`: first token and streaming speed). Past a policy's capacity, the server still
# finishes requests as fast as it can, but they wait longer and longer, and goodput falls even as
# throughput stays at its maximum.
#
# Which goodput? This plot shows **vLLM's benchmark goodput**: in each run, the requests per
# second that met every SLO (`metrics.goodput`, notebook 07). The other meaning, **DistServe's
# goodput** (Zhong et al., OSDI 2024), is one number per policy: the highest request rate at
# which at least 90% of requests still meet the SLO. It comes from the same sweep, below.

# %%
fig, ax = plt.subplots(figsize=(6.5, 4))
plot_load_curve(poisson_table, y="goodput", hue="policy", ax=ax,
                title=f"Goodput (TTFT <= {SLO_CHAT.ttft} s, TPOT <= {SLO_CHAT.tpot * 1e3:.0f} ms), Poisson")
for name, g in poisson_table.groupby("policy"):
    ax.plot(g["request_rate"], g["request_throughput"], linestyle=":", color="grey")
ax.plot([], [], linestyle=":", color="grey", label="throughput")
ax.legend(fontsize=8)
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
best = poisson_table.groupby("policy")["goodput"].max()
print("best goodput (req/s):", best.round(2).to_dict())
assert best["continuous"] > 1.5 * best["dynamic"], best
overloaded = poisson_table[(poisson_table["policy"] == "continuous") & (poisson_table["load"] > 1.1)]
assert (overloaded["goodput"] < 0.8 * best["continuous"]).all(), overloaded["goodput"]
assert (overloaded["request_throughput"] > 0.8 * chat_capacity["continuous"]).all()

# %% [markdown]
# Continuous batching's goodput follows the offered rate much further. Dynamic batching loses its
# good requests early: a newcomer waits for the running batch to end, so its first token blows
# through the TTFT target long before the device is saturated. And beyond capacity, even
# continuous batching's goodput falls while its throughput does not: the server is busy serving
# requests that are already too late.
#
# ### DistServe's goodput: the highest rate at which 90% meet the SLO
#
# For each run of the Poisson sweep, the **SLO attainment** is the share of all its requests
# that met the SLO (`metrics.slo_attainment`). DistServe's goodput is the highest rate at which
# the attainment is still at least 90%: `metrics.max_rate_meeting_slo` finds the first swept
# rate below 90% and interpolates between it and the rate before. The figure plots attainment
# against the rate; the dashed line is the 90% target and each marker is a policy's
# DistServe goodput.

# %%
# NBVAL_IGNORE_OUTPUT
ATTAINMENT_TARGET = 0.9
distserve = {name: metrics.max_rate_meeting_slo(g, ATTAINMENT_TARGET)
             for name, g in poisson_table.groupby("policy")}
fig, ax = plt.subplots(figsize=(6.5, 3.8))
for name, g in poisson_table.groupby("policy"):
    line, = ax.plot(g["request_rate"], metrics.slo_attainment(g), marker=".", label=name)
    if math.isfinite(distserve[name]):
        ax.plot([distserve[name]], [ATTAINMENT_TARGET], marker="D", color=line.get_color())
ax.axhline(ATTAINMENT_TARGET, linestyle="--", color="grey")
ax.set(xlabel="request rate (req/s)", ylabel="share of requests meeting the SLO",
       title="SLO attainment; markers: DistServe's goodput (90% target)")
ax.legend(fontsize=8)
plt.show()
print({name: f"{rate:.2f} req/s" for name, rate in distserve.items()},
      "| best vLLM-style goodput:", best.round(2).to_dict())

# %%
# Continuous batching takes more traffic before one request in ten misses the SLO.
assert distserve["continuous"] > distserve["dynamic"] or math.isnan(distserve["dynamic"]), distserve
print("DistServe goodput as a share of capacity:",
      {name: round(rate / chat_capacity[name], 2) for name, rate in distserve.items()})
# Where vLLM-style goodput peaks, what share of requests met the SLO?
peak_rows = poisson_table.loc[poisson_table.groupby("policy")["goodput"].idxmax()].set_index("policy")
print("SLO attainment at each policy's vLLM-goodput peak:", metrics.slo_attainment(peak_rows).round(2).to_dict())

# %% [markdown]
# The two goodputs answer different questions. vLLM's is a rate of good answers in one run: it
# can keep rising while the share of users served well falls, as long as the rate rises faster
# (the last printout gives the attainment where each policy's vLLM-style goodput peaks).
# DistServe's stops where more than one user in ten starts missing the target: a capacity you
# can promise. Sizing a fleet for a latency promise uses the second; judging one benchmark run
# uses the first.
#
# ### What a server does at overload: admission control, load shedding, priorities
#
# Past capacity the queue grows without bound, and every request in it gets later: the sweep's
# last point served at full throughput with its goodput already falling. The simulated server
# here queues every request it could ever fit; production servers do not. **Admission control**
# refuses work at the door when accepting it would break the promise (a bounded queue, a limit
# on requests or tokens in flight; vLLM bounds the running batch with `max_num_seqs` and the KV cache it has, and a
# gateway in front of it bounds the queue), answering "busy, retry later" (HTTP 429 or 503) at
# once instead of a first token after a minute. **Load shedding** drops work already queued
# whose deadline has passed, since serving it costs capacity and pleases no one. **Priorities**
# decide who is served first when not everyone can be: interactive before batch jobs, paying
# before free, or short before long (shortest-job-first shrinks the mean wait but can starve long
# requests). Each trades a few refused requests for the goodput of the rest, and both goodputs
# above are the numbers that tell you whether the trade paid. Queueing theory's classic treatment
# is Harchol-Balter, *Performance Modeling and Design of Computer Systems* (Cambridge, 2013); for
# LLM serving, DistServe (OSDI 2024) sizes its pools against an SLO attainment target rather
# than peak throughput for the same reason.

# %% [markdown]
# ## Who gives the first token sooner?
#
# The article makes a claim worth testing: *at low traffic, request-level dynamic batching can
# give a faster first token than continuous batching.* The sweep above does not show it: with
# chat prompts (which fit one step) continuous batching had the lower median TTFT at every load,
# even though at the same share of capacity the dynamic batcher saw fewer requests per second:

# %%
# NBVAL_IGNORE_OUTPUT
median_ttft = poisson_table.pivot(index="load", columns="policy", values="ttft_p50")
assert (median_ttft["continuous"] < median_ttft["dynamic"]).all(), median_ttft
(median_ttft * 1e3).round(1).rename(columns=lambda c: f"{c} TTFT p50 (ms)")

# %% [markdown]
# Whether the claim can ever be true depends on what each policy does with a newcomer.
#
# - **Continuous batching** admits a newcomer at the next step (after the step in progress ends),
#   and its prompt joins whatever runs there: a mixed step. With chunked prefill and a token budget of `B` tokens per step, a prompt of `P`
#   tokens is computed in `ceil(P / B)` steps (fewer tokens per step if running requests take
#   their decode token from the budget). Its first token comes with the last chunk. Every one of
#   those steps pays the step's fixed cost (reading all the weights) again.
# - **Dynamic batching** on an idle server waits for its timeout `T`, then starts a fresh batch
#   whose first step is the whole prompt, alone. With streaming, the first token is visible when
#   that one step ends: `T + one prefill step`.
# - If the dynamic batcher's server is busy, the newcomer waits until the *whole running batch*
#   is done, many decode steps. Continuous batching never makes anyone wait for that.
#
# So on an idle server dynamic batching wins exactly when the chunked prefill's extra fixed costs
# outweigh the timeout; with a prompt that fits one step and no timeout, the two are identical.
# Here it is by hand, with the fitted cost model, for a request alone:

# %%
def lone_ttft_continuous(prompt_len, budget):
    """TTFT of a request alone under continuous batching: one step per chunk of `budget` tokens."""
    ttft, start = 0.0, 0
    while start < prompt_len:
        n = min(budget, prompt_len - start)
        ttft += cost.predict_features(1, n, chunk_attention_pairs(start, n))
        start += n
    return ttft


def lone_ttft_dynamic(prompt_len, timeout):
    """TTFT of a request alone under dynamic batching (streaming): the timeout, then one prefill step."""
    return timeout + cost.predict_features(1, prompt_len, chunk_attention_pairs(0, prompt_len))

# %% [markdown]
# Splitting a prompt does not change how many tokens or attention pairs are computed in total
# (the chunks' pairs add up to the whole prompt's), so the difference is `(k - 1)` extra fixed
# and per-sequence costs for `k` chunks, minus the timeout. The simulator must agree exactly.
#
# The token budget below is 32 tokens, so that a 256-token prompt needs eight chunks, as a
# 4,096-token prompt does at a GPU server's budget of 512 (exercise 08.1). What decides the
# outcome is the number of chunks and a step's fixed cost next to a chunk's token cost: on a CPU
# the fixed cost is worth a few dozen prompt tokens (divide the two costs printed in the setup).
# That balance is this CPU's, not a law: on a GPU serving a model of billions of parameters a
# step's fixed cost (its weight read) is worth hundreds of prompt tokens, and servers there use
# budgets of 512 to 8,192 tokens, so a prompt needs far fewer chunks. The GPU-like cost model of
# the exercises (08.1, 08.2) shows how the answer moves.

# %%
# NBVAL_IGNORE_OUTPUT
MAP_BUDGET = 32                              # a small token budget per step (see below)
MAP_TIMEOUT = round(0.5 * DECODE_STEP, 4)    # a short timeout: half a decode step
MAP_OUTPUT = 64                              # tokens each answer makes


def pair_policies(budget=MAP_BUDGET, timeout=MAP_TIMEOUT, stream=True):
    """Dynamic (streaming, short timeout) and continuous (chunked prefill, token budget) batching."""
    return {"dynamic": lambda: DynamicBatcher(MAX_NUM_SEQS, timeout, stream=stream),
            "continuous": lambda: ContinuousBatcher(MAX_NUM_SEQS, budget, chunked_prefill=True)}


lone_rows = []
for prompt_len in (32, 256):                 # one chunk, eight chunks
    alone = scripted_workload([0.0], max_new_tokens=8, prompt_len=prompt_len)
    for name, factory in pair_policies().items():
        ttft_sim = metrics.per_request_metrics(Engine(factory(), sim()).run(alone))["ttft"].iloc[0]
        by_formula = (lone_ttft_dynamic(prompt_len, MAP_TIMEOUT) if name == "dynamic"
                      else lone_ttft_continuous(prompt_len, MAP_BUDGET))
        assert math.isclose(ttft_sim, by_formula, rel_tol=1e-9), (prompt_len, name, ttft_sim, by_formula)
        lone_rows.append({"prompt_len": prompt_len, "policy": name, "ttft_ms": ttft_sim * 1e3})
lone = pd.DataFrame(lone_rows).pivot(index="prompt_len", columns="policy", values="ttft_ms")
# A prompt that fits one step: continuous wins by the timeout. Eight chunks: dynamic wins.
assert lone.loc[32, "continuous"] < lone.loc[32, "dynamic"]
assert lone.loc[256, "dynamic"] < lone.loc[256, "continuous"]
# With no timeout and a prompt that fits one step, both do exactly the same: one pure prefill step.
no_wait = Engine(DynamicBatcher(MAX_NUM_SEQS, 0.0, stream=True), sim()).run(
    scripted_workload([0.0], max_new_tokens=8, prompt_len=32))
assert math.isclose(metrics.per_request_metrics(no_wait)["ttft"].iloc[0] * 1e3, lone.loc[32, "continuous"])
lone.round(1)

# %% [markdown]
# At medium traffic the other effect takes over. Four requests are decoding 48-token answers when
# a newcomer with a 256-token prompt arrives. Continuous batching starts its prompt at the next
# step, in chunks beside the decodes; the dynamic batcher makes it wait for the running batch.

# %%
# NBVAL_IGNORE_OUTPUT
# The newcomer arrives about 10 decode steps after the others.
scene = scripted_workload([0.0] * 4 + [round(10 * DECODE_STEP, 4)], max_new_tokens=[48] * 4 + [8],
                          prompt_len=[32] * 4 + [256])
scene_traces = {name: Engine(factory(), sim()).run(scene) for name, factory in pair_policies().items()}
newcomer_ttft = {name: metrics.per_request_metrics(t).set_index("request_id").loc["r004", "ttft"]
                 for name, t in scene_traces.items()}
print({name: f"{v:.2f} s" for name, v in newcomer_ttft.items()})
assert newcomer_ttft["continuous"] < 0.5 * newcomer_ttft["dynamic"], newcomer_ttft

# %%
fig, axes = plt.subplots(2, 1, figsize=(9, 4.5), sharex=True)
for ax, (name, trace) in zip(axes, scene_traces.items()):
    plot_timeline(trace, ax=ax, title=f"{name}: the newcomer (bottom row) waits "
                                      f"{newcomer_ttft[name]:.2f} s for its first token")
fig.tight_layout()
plt.show()

# %% [markdown]
# ### A map of who wins
#
# Two effects pull in opposite directions. Which one wins depends on how many chunks a prompt
# needs, and on how likely a newcomer is to find a dynamic batch already running. That chance is
# set by the **offered concurrency**: the request rate times the time one answer takes when
# served alone. It is how many answers would be in progress at once if each had the server to
# itself (Little's law). Well below 1 a newcomer usually finds the server idle; above 1 it
# usually does not. (Continuous batching, running 16 at once, is far from its capacity at a
# concurrency of 1.)
#
# We map it on the simulator: prompts of 32 to 384 tokens (1 to 12 chunks at the budget of 32),
# each answering 64 tokens, Poisson arrivals at offered concurrencies from 0.05 to 1.6. Each cell
# is the ratio of median TTFTs, dynamic over continuous: below 1, dynamic batching gives the
# first token sooner.

# %%
# NBVAL_IGNORE_OUTPUT
PROMPT_LENS = [32, 64, 128, 256, 384]
CONCURRENCIES = [0.05, 0.1, 0.2, 0.4, 0.8, 1.6]


def lone_service_time(prompt_len, output_len):
    """Seconds one request takes from arrival to last token when it has the server to itself."""
    alone = scripted_workload([0.0], max_new_tokens=output_len, prompt_len=prompt_len)
    trace = Engine(ContinuousBatcher(max_num_seqs=1, max_num_batched_tokens=prompt_len), sim()).run(alone)
    return float(metrics.per_request_metrics(trace)["e2e"].iloc[0])


def prompt_workload(prompt_len, output_len=MAP_OUTPUT, n=MAP_REQUESTS, seed=1, tokenizer=None):
    """A function rate -> requests with fixed prompt and answer lengths, Poisson arrivals."""
    return lambda rate: make_workload(n, prompt_len=prompt_len, output_len=output_len,
                                      arrival="poisson", rate=rate, seed=seed, tokenizer=tokenizer)


map_parts = []
for prompt_len in PROMPT_LENS:
    service = lone_service_time(prompt_len, MAP_OUTPUT)
    part = load_sweep(prompt_workload(prompt_len), [c / service for c in CONCURRENCIES],
                      pair_policies(), sim, progress=False)
    map_parts.append(part.assign(prompt_len=prompt_len, concurrency=np.tile(CONCURRENCIES, 2)))
who_wins = pd.concat(map_parts, ignore_index=True)
ttft_p50 = who_wins.pivot_table(index="prompt_len", columns=["concurrency", "policy"], values="ttft_p50")
ratio_map = (ttft_p50.xs("dynamic", axis=1, level="policy")
             / ttft_p50.xs("continuous", axis=1, level="policy"))
ratio_map.round(2)

# %%
fig, ax = plt.subplots(figsize=(8, 4))
image = ax.imshow(np.log2(ratio_map.to_numpy()), cmap="RdBu_r", vmin=-3, vmax=3, aspect="auto",
                  origin="lower")
for i in range(ratio_map.shape[0]):
    for j in range(ratio_map.shape[1]):
        ax.text(j, i, f"{ratio_map.iloc[i, j]:.2f}", ha="center", va="center", fontsize=8)
ax.set_xticks(range(len(CONCURRENCIES)), [f"{c:g}" for c in CONCURRENCIES])
ax.set_yticks(range(len(PROMPT_LENS)),
              [f"{p} ({math.ceil(p / MAP_BUDGET)} chunk{'s' if p > MAP_BUDGET else ''})"
               for p in PROMPT_LENS])
ax.set_xlabel("offered concurrency (request rate x time one answer takes alone)")
ax.set_ylabel("prompt tokens")
fig.colorbar(image, ax=ax, label="log2(TTFT p50 dynamic / continuous)")
ax.set_title("Blue: dynamic's first token comes sooner (light traffic, prompts of several chunks)")
plt.show()

# %% [markdown]
# What the map says, asserted:
#
# 1. **Light traffic, prompts longer than the budget: dynamic wins.** At the lowest concurrency
#    nearly every request finds both servers idle; continuous batching pays `ceil(P / B) - 1`
#    extra step costs, dynamic batching its short timeout. The medians there are exactly the
#    lone-request values worked out above, and they stay the winners up to a concurrency of 0.2.
# 2. **Light traffic, prompts that fit one step: continuous wins**, by the timeout.
# 3. **From a concurrency of 0.8 on, continuous wins for every prompt length**: a dynamic
#    batcher's newcomer usually arrives while a batch is running and waits for all of it.
#
# Why does the switch come between 0.4 and 0.8? A dynamic batcher that mostly serves one request
# at a time is busy a share of the time about equal to the offered concurrency, and Poisson
# arrivals find it busy that same share of the time (random arrivals see time averages). Once
# more than half of the newcomers find a batch running, the *median* newcomer is one that waits.

# %%
# NBVAL_IGNORE_OUTPUT
lightest = CONCURRENCIES[0]
for prompt_len in PROMPT_LENS:
    light = ratio_map.loc[prompt_len, lightest]
    if prompt_len > MAP_BUDGET:
        assert light < 0.95, f"P={prompt_len}: dynamic should win at {lightest}, ratio {light:.2f}"
    else:
        assert light > 1.05, f"P={prompt_len}: continuous should win at {lightest}, ratio {light:.2f}"
    # At the lightest load the median request is alone: the medians are the formulas' values.
    cell = ttft_p50.loc[prompt_len, lightest]
    assert math.isclose(cell["continuous"], lone_ttft_continuous(prompt_len, MAP_BUDGET), rel_tol=0.02)
    assert math.isclose(cell["dynamic"], lone_ttft_dynamic(prompt_len, MAP_TIMEOUT), rel_tol=0.02)
    for concurrency in CONCURRENCIES:
        r = ratio_map.loc[prompt_len, concurrency]
        if concurrency <= 0.2 and prompt_len > MAP_BUDGET:
            assert r < 1.0, f"P={prompt_len}, concurrency {concurrency}: dynamic should win, ratio {r:.2f}"
        if concurrency >= 0.8:
            assert r > 1.0, f"P={prompt_len}, concurrency {concurrency}: continuous should win, ratio {r:.2f}"
print("dynamic wins only under light traffic with prompts of several chunks; continuous everywhere else")

# %% [markdown]
# Two more conditions the claim needs, both of which can quietly turn it false:
#
# - **Streaming.** A non-streaming dynamic batcher hands back an answer when its batch ends, so
#   its "first token" arrives with the last one, after all 64 decode steps. It never wins.
# - **A small token budget.** With a budget that holds the whole prompt (`B >= P`), continuous
#   batching computes the prompt in one step, just like the dynamic batcher, without the timeout.
#   Its advantage at light load disappears.

# %%
# NBVAL_IGNORE_OUTPUT
longest = PROMPT_LENS[-1]
light_rate = lightest / lone_service_time(longest, MAP_OUTPUT)
conditions = load_sweep(prompt_workload(longest), [light_rate], {
    f"continuous, budget {MAP_BUDGET}": pair_policies()["continuous"],
    "dynamic, streaming": pair_policies()["dynamic"],
    "dynamic, not streaming": pair_policies(stream=False)["dynamic"],
    f"continuous, budget {2 * longest}": pair_policies(budget=2 * longest)["continuous"],
}, sim, progress=False).set_index("policy")
ttft = conditions["ttft_p50"]
print((ttft * 1e3).round(1).to_string())
assert ttft["dynamic, streaming"] < ttft[f"continuous, budget {MAP_BUDGET}"]
assert ttft["dynamic, not streaming"] > 2 * ttft[f"continuous, budget {MAP_BUDGET}"]
assert ttft[f"continuous, budget {2 * longest}"] < ttft["dynamic, streaming"]

# %% [markdown]
# So the article's sentence holds, under conditions worth stating: **light traffic**, **streaming**,
# a **short timeout**, and prompts that continuous batching splits into **several chunks** (a
# token budget smaller than the prompt). The size of the win is `ceil(P / B) - 1` step overheads
# minus the timeout, a fixed number of milliseconds per prompt; what a dynamic batcher's newcomer
# loses under load is a whole running batch, seconds. Under any real load, or with a budget that
# holds the prompt, continuous batching gives the first token sooner.
#
# ## The simulator against the real model
#
# Everything since the setup ran on the simulator. How far can it be trusted? We serve two small
# workloads on the real model and on the simulator, with the very same requests, under both
# policies of the map (budget 32, short timeout), at two points of the map:
#
# - **light**: 256-token prompts (8 chunks), 8-token answers, offered concurrency 0.05, where
#   dynamic batching should win;
# - **busier**: 128-token prompts (4 chunks), 32-token answers, offered concurrency 3, where
#   continuous batching should win.
#
# Arrivals are evenly spaced (`arrival="fixed"`), so a handful of requests already shows what the
# rate does. Four real runs, about half a minute on a CPU.

# %%
# NBVAL_IGNORE_OUTPUT
SPOT_POINTS = {  # name: (prompt tokens, answer tokens, offered concurrency, number of requests)
    "light": (256, 8, 0.05, 16 if ON_GPU else 6),
    "busier": (128, 32, 3.0, 24 if ON_GPU else 8),
}


def spot_workload(point):
    """The point's requests (real prompts, so the real model can serve them) and its rate."""
    prompt_len, output_len, concurrency, n = SPOT_POINTS[point]
    rate = round(concurrency / lone_service_time(prompt_len, output_len), 4)
    workload = lambda r: make_workload(n, prompt_len=prompt_len, output_len=output_len,  # noqa: E731
                                       arrival="fixed", rate=r, tokenizer=lm.tokenizer)
    return workload, rate


spot = {point: spot_workload(point) for point in SPOT_POINTS}


def serve_spot(backend_factory, progress=False):
    """Both policies at both points: a table with one row per (point, policy), and the traces."""
    tables, traces = [], {}
    for point, (workload, rate) in spot.items():
        table = load_sweep(workload, [rate], pair_policies(), backend_factory, progress=progress,
                           keep_traces=True)
        traces.update({(point, policy): t for (policy, _), t in table.attrs["traces"].items()})
        tables.append(table.assign(point=point))
    return pd.concat(tables, ignore_index=True), traces


spot_sim, _ = serve_spot(sim)
spot_sim[["point", "policy", "request_rate", "ttft_p50", "e2e_p50"]].round(3)

# %%
# NBVAL_IGNORE_OUTPUT
spot_real, spot_real_traces = serve_spot(lambda: backend, progress=True)

# %% [markdown]
# What should agree, and how closely? The simulator replays the same requests with the same
# policy, so its only error is the time it predicts for each step. That error has two parts:
#
# - **The shape of the costs**: how long a 256-token prefill is next to a decode step, how much a
#   chunk adds, how a step grows with its batch. This is what the simulator is for, and what every
#   conclusion of this notebook rests on.
# - **The machine's overall speed**: the cost model was fitted a few minutes ago. If anything else
#   has run since (other programs, a CPU clock change), every real step is slower or faster by a
#   common factor. On a shared machine that factor can be large, and it says nothing about the
#   simulator; but it does change the results, because the requests arrive at the same times
#   whatever the speed, so a slower machine is a busier one.
#
# Every real step can be compared with what the cost model predicts for exactly that step. The
# median ratio is the machine's speed now relative to the calibration; the spread around it is
# the error in the shape.

# %%
# NBVAL_IGNORE_OUTPUT
real_steps = pd.concat([features_df(trace) for trace in spot_real_traces.values()], ignore_index=True)
real_steps["predicted"] = cost.predict_df(real_steps)
measured_over_predicted = real_steps["duration"] / real_steps["predicted"]
SPEED = float(measured_over_predicted.median())
spread = np.percentile(measured_over_predicted / SPEED, [10, 90])
print(f"{len(real_steps)} real steps took {SPEED:.2f}x the calibrated prediction (median); "
      f"80% of them within {spread[0]:.2f}x-{spread[1]:.2f}x of that")

fig, ax = plt.subplots(figsize=(5, 4))
ax.loglog(real_steps["predicted"] * SPEED * 1e3, real_steps["duration"] * 1e3, ".", alpha=0.6)
lims = [real_steps["duration"].min() * 1e3 / 1.5, real_steps["duration"].max() * 1e3 * 1.5]
ax.plot(lims, lims, color="black", linestyle="--", linewidth=1, label="measured = predicted")
ax.set_xlabel(f"predicted step time x {SPEED:.2f} (ms)")
ax.set_ylabel("measured step time (ms)")
ax.set_title("Real steps of the spot check against the cost model")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# We give the simulator that one number, the measured speed factor (every cost multiplied by
# `SPEED`), serve the same requests again, and compare medians in seconds: TTFT, ITL and
# end-to-end latency, real against simulated, within **35%**. Why 35%: the fit's own error per
# step is printed with the cost model in the setup (on a quiet machine its median is well under
# 15%; a busy machine shows up there first) and the spread of the real steps is printed above; a
# median over a handful of requests inherits about that, and the rest is timing noise between
# runs. A wrong mechanism (a missing chunk, a wait for the wrong batch, a prefill cost off by a
# factor) moves these numbers by far more.

# %%
# NBVAL_IGNORE_OUTPUT
at_this_speed = CostModel(*(c * SPEED for c in cost.coefficients), source=f"{cost.source}, x{SPEED:.2f}")
spot_sim_now, _ = serve_spot(lambda: sim(at_this_speed))
SPOT_METRICS = ["ttft_p50", "itl_p50", "e2e_p50"]
keys = ["point", "policy"]
side_by_side = (spot_real[keys + SPOT_METRICS]
                .merge(spot_sim_now[keys + SPOT_METRICS], on=keys, suffixes=("_real", "_sim"))
                .set_index(keys))
for m in SPOT_METRICS:
    side_by_side[f"{m} sim/real"] = side_by_side[f"{m}_sim"] / side_by_side[f"{m}_real"]
side_by_side.round(3)

# %% [markdown]
# The more important check needs no simulator at all: on the real model itself, measured side by
# side, dynamic batching gives the first token sooner at the light point and continuous batching
# at the busier one.

# %%
# NBVAL_IGNORE_OUTPUT
SPOT_TOLERANCE = 0.35
ratios = side_by_side[[f"{m} sim/real" for m in SPOT_METRICS]]
assert ((ratios > 1 - SPOT_TOLERANCE) & (ratios < 1 + SPOT_TOLERANCE)).all().all(), ratios.round(2)

real_ttft = spot_real.pivot(index="point", columns="policy", values="ttft_p50")
real_ratio = real_ttft["dynamic"] / real_ttft["continuous"]
print("real model, TTFT p50 dynamic / continuous:", real_ratio.round(2).to_dict())
assert real_ratio["light"] < 1 < real_ratio["busier"], real_ttft

# %% [markdown]
# ## Explorer: rate and burstiness
#
# Pick a request rate and a burstiness, and the explorer serves the chat workload under both
# policies (one `load_sweep` call at that rate) and shows the arrivals and the latencies. Try a
# rate near continuous batching's capacity, then lower the burstiness at the same rate.

# %%
def show_load(rate=1.0, burstiness=1.0):
    """Arrivals and TTFT/ITL of the chat workload at `rate` req/s under both chat policies."""
    workload = lambda r: chat_workload(r, burstiness, n=300)   # noqa: E731
    row = load_sweep(workload, [rate], chat_policies, sim, progress=False).set_index("policy")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.2), gridspec_kw={"width_ratios": [1.3, 1]})
    left.eventplot([r.arrival_time for r in workload(rate)], linelengths=0.8, linewidths=0.6)
    left.set_yticks([])
    left.set_xlabel("arrival time (s)")
    left.set_title(f"{rate:g} req/s, burstiness {burstiness:g}")
    stats = row[["ttft_p50", "ttft_p99", "itl_p50", "itl_p99"]].T * 1e3
    stats.plot.bar(ax=right, logy=True, rot=0)
    right.set_ylabel("ms (log scale)")
    right.set_title(f"continuous capacity ≈ {chat_capacity['continuous']:.1f} req/s")
    fig.tight_layout()
    return fig

# %%
fig = show_load(rate=round(0.7 * chat_capacity["continuous"], 1), burstiness=BURSTY)
plt.show()

# %%
explore(show_load, rate=(0.2, round(1.5 * chat_capacity["continuous"], 1), 0.1),
        burstiness=(0.1, 2.0, 0.05))

# %% [markdown]
# ## Summary
#
# - A load sweep serves the same requests at rising rates; `load_sweep` does it for several
#   policies and returns a tidy table. Placing rates as fractions of measured `capacity` makes
#   the sweep mean the same on any machine.
# - Peak-hour queueing shows up in the first token: toward saturation TTFT p99 grew many times
#   over while ITL p50 grew a little, for both policies and both arrival processes. Bursty
#   traffic (gamma gaps, burstiness 0.25) made TTFT p99 worse at the same average rate.
# - Continuous batching had the higher capacity and far higher goodput; beyond capacity goodput
#   fell while throughput held.
# - The article's claim holds only under stated conditions: light traffic (offered concurrency
#   well below 1), streaming, a short timeout, and prompts longer than continuous batching's
#   token budget (several chunks, each paying a step's fixed cost). The win is those extra
#   step overheads. Once a newcomer is likely to find a batch running, continuous batching wins,
#   because a dynamic batcher's newcomer waits for the whole running batch.
# - The simulator, calibrated on this machine and told the machine's speed during the check,
#   matched the real model's median TTFT, ITL and end-to-end latency within 35% at a light and a
#   busier point of the map, and the real model showed the same winner at each.

# %% [markdown]
# ## Exercises
#
# The first two use a *GPU-like* cost model: a much smaller fixed cost per step, and much cheaper
# tokens. Is the article's claim still true there? Worked solutions are in
# `solutions/08_load_tails_and_who_wins.py`.

# %%
gpu_like = CostModel(fixed_s=0.006, per_seq_s=1e-4, per_token_s=2e-5, per_attention_pair_s=1e-9,
                     source="exercise: GPU-like")

# %% [markdown]
# **08.1** With `gpu_like`, a request with a 4,096-token prompt arrives at an idle server.
# Continuous batching uses chunked prefill with `max_num_batched_tokens=512`; dynamic batching streams
# and has a timeout of 2 ms. How many seconds sooner does dynamic batching give the first token
# (TTFT continuous minus TTFT dynamic; negative if it is later)?

# %%
answer = None  # your code here
check("08.1", answer)

# %% [markdown]
# **08.2** Same request and budget. What is the longest dynamic-batching timeout (in seconds) for
# which dynamic batching still gives the first token no later than continuous batching?

# %%
answer = None  # your code here
check("08.2", answer)

# %% [markdown]
# **08.3** Back to this notebook's chat policies, on the simulator with `gpu_like` (KV cache of
# `16 * 512` tokens). Serve `make_workload(400, "chat", arrival="poisson", rate=r, seed=7)` under
# `ContinuousBatcher(max_num_seqs=16, max_num_batched_tokens=256)` at the rates
# `[20, 40, 60, 80, 100, 120]` req/s. With the SLO `TTFT <= 0.1 s, TPOT <= 0.02 s`, which rate
# gives the highest goodput? (Answer with the rate.)

# %%
answer = None  # your code here
check("08.3", answer)
