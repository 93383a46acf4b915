# %% [markdown]
# # 08 · Load, tails, and goodput
#
# Every earlier notebook served one workload at one traffic level. A real server does not get to
# choose: traffic is light at night and heavy at peak hour, and it comes in clumps. This notebook
# turns traffic into a knob. We serve the *same* requests at rising request rates, with smooth
# (Poisson) and clumpy (bursty) arrivals, under dynamic and continuous batching, and watch what
# climbs first; then we count the requests that were worth serving (goodput), in both of the
# meanings the literature gives the word.
#
# Hundreds of requests at a dozen rates is far beyond what a CPU can serve with the real model in
# a minute, so the sweeps run on the simulator, with step times fitted to the real model on this
# machine. Notebook 09 then checks the simulator against the real model, and asks who gives the
# first token sooner at low traffic.
#
# ## What you will learn
#
# - A **load sweep**: the same requests served at several request rates, written out in a few
#   lines, and `batchlab.experiments.sweeps.load_sweep`, which does the same for several policies at once.
# - **Poisson and bursty arrivals**: the same average rate with different clumping (gamma
#   gaps, `burstiness < 1`), and what clumping does to tail latency.
# - **TTFT climbs first**: as traffic approaches what the server can do, waiting in the queue
#   makes the time to first token grow many times over (p50 and p99), while the inter-token
#   latency grows by a smaller factor; its tail shows prefill interference.
# - **Goodput**, both meanings: vLLM's (requests per second that meet every latency target, in
#   one run) and DistServe's (the highest rate at which 90% of requests meet it), and what a
#   server does at overload.

# %% [markdown]
# ## Setup
#
# We load the model, measure its step costs (`calibrate_cost_model` serves a short, varied
# workload on the real model and fits the simulator's four-term cost formula to the measured
# steps; up to half a minute on a CPU, a few seconds when `reuse=True` finds a stored fit that
# still predicts fresh steps), and build simulator backends whose KV cache is the size of the
# real backend's.

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from batchlab.analysis import metrics
from batchlab.analysis.claims import expect, expect_close, expect_true
from batchlab.analysis.plots import plot_load_curve
from batchlab.analysis.widgets import explore
from batchlab.backends import ModelBackend
from batchlab.sim import SimBackend
from batchlab.experiments.calibration import calibrate_cost_model
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.exercises import check
from batchlab.experiments.sweeps import capacity, load_sweep
from batchlab.model import load_model
from batchlab.schedulers import ContinuousBatcher, DynamicBatcher
from batchlab.workloads import make_workload

# %%
lm = load_model()
print(f"{lm.name} on {lm.device} ({lm.dtype})")

# Sizes. The sweeps run on the simulator, so they are CPU work on any machine.
MAX_NUM_SEQS = 16            # sequences a policy may run at once (KV slots)
MAX_SEQ_LEN = 512            # tokens per slot: prompt + output of one request
SWEEP_REQUESTS = 600         # requests per simulated run of the load sweeps

backend = ModelBackend(lm, num_slots=MAX_NUM_SEQS, max_seq_len=MAX_SEQ_LEN)


def sim(cost_model=None):
    """A fresh simulator backend with the real backend's KV cache size (and the fitted `cost`)."""
    return SimBackend(cost_model or cost, kv_capacity_tokens=MAX_NUM_SEQS * MAX_SEQ_LEN,
                      max_seq_len=MAX_SEQ_LEN)

# %%
# NBVAL_IGNORE_OUTPUT
cost = calibrate_cost_model(backend, reuse=True)
print(cost)
if cost.fit_stats["median_rel_error"] > 0.15:
    print("Warning: the fit is poor, so other programs were probably competing for the CPU.")
# One decode step of one sequence with 64 tokens of context: the basic unit of time on this machine.
DECODE_STEP = cost.predict_features(1, 1, 65)
print(f"a decode step at batch 1: {DECODE_STEP * 1e3:.1f} ms")

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
    expect_close(f"{name}: mean gap (s)", gaps.mean(), 1.0, rel_tol=0.25)
    expect_close(f"{name}: CV of the gaps, against 1 / sqrt(b)", cv, 1 / math.sqrt(b), rel_tol=0.25)
expect_true("the same requests, moved in time", [r.prompt_len for r in smooth] == [r.prompt_len for r in bursty])

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
expect_true("load_sweep agrees with the hand-written loop",
            [np.allclose(same[col], by_hand[col]) for col in ("ttft_p50", "ttft_p99", "itl_p50", "e2e_p90", "busy_share")])

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
expect("capacity, continuous / dynamic", chat_capacity["continuous"] / chat_capacity["dynamic"], above=1.05)

LOAD_FRACTIONS = [0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 0.95, 1.2]
print("loads (share of each policy's capacity):", LOAD_FRACTIONS)

# %% [markdown]
# Continuous batching serves more (more than 5% more here; the capacities are printed above): its
# batch is refilled every step, while a dynamic batch runs
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
# Why the difference? The inter-token latency is the length of a decode step. More traffic means
# fuller steps, and on this CPU a fuller step is slower: each sequence adds its own share of the
# step (the fitted per-sequence and per-token costs, next to the fixed cost), so from 10% to 95%
# of capacity ITL p50 grows too: by a fifth to three quarters here, depending on the calibration
# (the growth table below). (On a GPU a decode step of 16 sequences costs about what a step of
# one does, and ITL grows far less; notebook 01.) The time to first token
# contains the decode-free part of that *and* the wait in the queue, and a queue grows without
# bound as the arrival rate approaches the service rate. So the first token grows by far more:
# at the peak hour it is what users notice.
#
# The claims, for each policy and arrival process, from 10% to 95% of the policy's capacity
# (bounds with room for the spread we measured across calibrations, which put TTFT p50's growth
# between 10 and 27 and TTFT p99's between 3.9 and 21): TTFT p50 grows more than six times and
# TTFT p99 more than two and a half times; on a CPU, ITL p50 grows by more than a tenth; and ITL
# grows by a smaller factor at the same percentile, under a third of TTFT's growth at p50 and
# under three quarters at p99.

# %%
# NBVAL_IGNORE_OUTPUT
growth_rows = []
for (policy, arrivals), g in load_table.groupby(["policy", "arrivals"]):
    light, heavy = g.set_index("load").loc[0.1], g.set_index("load").loc[0.95]
    growth_rows.append({"policy": policy, "arrivals": arrivals,
                        **{f"{m}_growth": heavy[m] / light[m] for m in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")}})
growth = pd.DataFrame(growth_rows).set_index(["policy", "arrivals"])
growth.round(2)

# %%
expect("TTFT p50 growth, 10% to 95% load", growth["ttft_p50_growth"], above=6)
expect("TTFT p99 growth, 10% to 95% load", growth["ttft_p99_growth"], above=2.5)
if lm.device == "cpu":
    expect("ITL p50 growth, 10% to 95% load (fuller steps are slower on a CPU)", growth["itl_p50_growth"], above=1.1)
expect("ITL p50 growth / TTFT p50 growth", growth["itl_p50_growth"] / growth["ttft_p50_growth"], below=1 / 3)
expect("ITL p99 growth / TTFT p99 growth", growth["itl_p99_growth"] / growth["ttft_p99_growth"], below=0.75)

# %% [markdown]
# The tail of the inter-token latency is where another cost of traffic shows: under continuous
# batching a decode step that also computes a newcomer's prompt (**prefill interference**,
# notebook 06) is several times longer than a plain one, so a streaming user sees some gaps far
# longer than the typical one. A dynamic batch never takes a newcomer in while it decodes, so
# its gaps vary only with the batch size. Checked from 40% to 95% of capacity, both arrival
# processes: under continuous batching ITL p99 is more than 1.8 times ITL p50, and that spread is
# wider than under dynamic batching at the same share of its capacity.

# %%
# NBVAL_IGNORE_OUTPUT
busy_loads = load_table[load_table["load"].between(0.4, 0.95)].copy()
busy_loads["itl_tail"] = busy_loads["itl_p99"] / busy_loads["itl_p50"]
itl_tail = busy_loads.pivot_table(index=["arrivals", "load"], columns="policy", values="itl_tail")
expect("continuous: ITL p99 / ITL p50, loads 40% to 95%", itl_tail["continuous"], above=1.8)
expect("ITL p99 / p50, continuous over dynamic", itl_tail["continuous"] / itl_tail["dynamic"], above=1.0)
itl_tail.round(2)

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
expect("bursty / Poisson, TTFT p99, loads up to 70%", tail_ratio, above=1.2)
expect("bursty / Poisson, ITL p50 over the same ratio for TTFT p99", itl_ratio / tail_ratio, below=1.0)

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
expect("best goodput, continuous / dynamic", best["continuous"] / best["dynamic"], above=2)
overloaded = poisson_table[(poisson_table["policy"] == "continuous") & (poisson_table["load"] > 1.1)]
expect("continuous past capacity: goodput / its best", overloaded["goodput"] / best["continuous"], below=0.25)
expect("continuous past capacity: throughput / capacity",
       overloaded["request_throughput"] / chat_capacity["continuous"], above=0.8)

# %% [markdown]
# Continuous batching's goodput follows the offered rate much further: its best is more than
# twice dynamic batching's. Dynamic batching loses its good requests early: a newcomer waits for
# the running batch to end, so its first token blows through the TTFT target long before the
# device is saturated. And beyond capacity, even continuous batching's goodput falls to a small
# fraction of its best (under a quarter) while its throughput stays above 80% of capacity: the
# server is busy serving requests that are already too late.
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
# (NaN: the policy missed the target at every rate swept; continuous must not.)
expect_true("continuous takes more traffic before one request in ten misses the SLO",
            math.isfinite(distserve["continuous"])
            and (math.isnan(distserve["dynamic"]) or distserve["continuous"] > distserve["dynamic"]), distserve)
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
# - Peak-hour queueing shows up in the first token: from 10% to 95% of capacity, TTFT p50 grew
#   more than sixfold and TTFT p99 more than 2.5-fold, while ITL grew by a smaller factor at the
#   same percentile (by more than a tenth at p50 on this CPU, whose fuller decode steps are slower),
#   for both policies and both arrival processes. Under continuous batching the ITL tail is
#   prefill interference: ITL p99 more than 1.8 times ITL p50 under load, wider than
#   dynamic batching's. Bursty traffic (gamma gaps, burstiness 0.25) made TTFT p99 worse at the
#   same average rate.
# - Continuous batching had the higher capacity and more than twice the best goodput; beyond
#   capacity goodput fell to a small fraction while throughput held.
# - Two goodputs: vLLM's counts the requests per second that met every SLO in one run (the goodput
#   plot); DistServe's is the highest rate at which 90% of requests met it (the attainment plot),
#   a capacity you can promise. Past capacity, admission control, load shedding and priorities
#   trade a few refused requests for the goodput of the rest.
# - Next, notebook 09: who gives the first token sooner at low traffic, and the simulator checked
#   against the real model.

# %% [markdown]
# ## Exercises
#
# On the simulator with a *GPU-like* cost model: a much smaller fixed cost per step, and much
# cheaper tokens. Worked solutions are in `solutions/08_load_tails_and_goodput.py`.

# %%
gpu_like = CostModel(fixed_s=0.006, per_seq_s=1e-4, per_token_s=2e-5, per_attention_pair_s=1e-9,
                     source="exercise: GPU-like")

# %% [markdown]
# **08.1** Serve `make_workload(400, "chat", arrival="poisson", rate=r, seed=7)` on the simulator
# with `gpu_like` (KV cache of `16 * 512` tokens) under
# `ContinuousBatcher(max_num_seqs=16, max_num_batched_tokens=256)` at the rates
# `[20, 40, 60, 80, 100, 120]` req/s. With the SLO `TTFT <= 0.1 s, TPOT <= 0.02 s`, which rate
# gives the highest (vLLM-style) goodput? (Answer with the rate.)

# %%
answer = None  # your code here
check("08.1", answer)

# %% [markdown]
# **08.2** Same sweep and SLO. What is DistServe's goodput there: the highest request rate at
# which at least 90% of the requests meet the SLO, interpolated between swept rates the way
# `metrics.max_rate_meeting_slo` does? (Answer in req/s.)

# %%
answer = None  # your code here
check("08.2", answer)

# %% [markdown]
# **08.3** At 80 req/s the vLLM-style goodput is still about four fifths of its peak. What share
# of that run's requests met the SLO (its SLO attainment, between 0 and 1)? Compare the two
# numbers: which one would you put in a promise to users?

# %%
answer = None  # your code here
check("08.3", answer)
