# %% [markdown]
# # 06 · Prefill stalls and chunked prefill
#
# Continuous batching (notebook 04) lets a waiting request join at the very next step. That
# step computes the newcomer's whole prompt next to everybody else's one decode token, and a
# step lasts as long as all of its work. So the moment a long prompt is admitted, every request
# that was streaming tokens sits through one heavy step before it gets its next token: its
# inter-token gap jumps. The article names the cost in one sentence (a newcomer's prefill
# delays everyone else's tokens) and the cure in the next: cut long prompts into pieces and
# spread them over several steps. This notebook measures both on the real model.
#
# ## What you will learn
#
# - Why a newcomer's prefill stalls the requests already decoding: a step's time grows with
#   the tokens it computes, and everyone in the step waits for all of them.
# - To see the stall on the real model: the running requests' gap between tokens jumps several
#   times at the step that admits a long prompt.
# - How **chunked prefill** spreads a prompt over steps under a per-step token budget
#   (`ContinuousBatcher(max_num_batched_tokens=...)`, vLLM's `max_num_batched_tokens`), and how
#   much smoother the running requests' tokens become.
# - The price: the newcomer's first token comes later. Sweeping the budget draws the trade
#   between its TTFT and the others' inter-token latency, and a latency target picks the budget.
#
# TTFT, ITL (each gap between two tokens) and TPOT (a request's mean gap) are defined, on one
# request's timeline, in the [glossary in notebook 00](00_setup_and_tour.ipynb#glossary).

# %% [markdown]
# ## Setup
#
# The real model serves the experiment; a simulator calibrated on it (the step-time formula of
# `batchlab.steptime.cost_model`, fitted to a few hundred real steps of many shapes) serves the full
# budget sweep. The calibration takes some seconds and adapts to whatever device runs this.

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

# %%
# The course's package: the modules this notebook's sections use.
from batchlab.analysis.claims import expect, expect_true
from batchlab.analysis.diagnosis import token_gaps
from batchlab.analysis.widgets import explore
from batchlab.backends import ModelBackend
from batchlab.sim import SimBackend
from batchlab.experiments.calibration import calibrate_cost_model
from batchlab.steptime.device_presets import load_device_presets
from batchlab.steptime.kernel_profiles import KERNEL_PROFILES_DIR, compare_profile, read_kernel_profile
from batchlab.steptime.roofline import RooflineCostModel
from batchlab.engine import Engine
from batchlab.exercises import check
from batchlab.experiments.prefill_stall import (
    StallScenario,
    budget_sweep,
    long_prompt_len_for,
    plot_token_gaps,
    stall_summary,
)
from batchlab.model import load_model
from batchlab.schedulers import ContinuousBatcher
from batchlab.vllm_sim import VllmReplica

lm = load_model()
ON_GPU = lm.device == "cuda"
print(f"{lm.name} on {lm.device} ({lm.dtype})")

# %%
# NBVAL_IGNORE_OUTPUT
cost = calibrate_cost_model(ModelBackend(lm, num_slots=16, max_seq_len=512), progress=True, reuse=True)
print(cost)

# %% [markdown]
# ## Why a prefill stalls the others
#
# A step computes all its tokens in one forward pass (the packed step of notebook 00): the
# decode tokens of the running requests and, if someone joins, the newcomer's prompt chunk. The
# calibrated formula says what each part costs: a fixed cost per step (reading the weights),
# plus a cost per sequence, per token and per attention pair. A decode step of a few sequences
# is mostly the fixed cost. A prompt of a few hundred tokens adds hundreds of tokens of matrix
# work to that *same* step, and every request in the step gets its next token only when the
# step ends.
#
# The experiment, on a server with room for five sequences (`max_num_seqs=5`; nine on a GPU):
# four decode-heavy requests (eight on a GPU) and one with a short answer start together and
# stream their tokens. A request with a long prompt arrives with them, finds the server full
# and waits. When the short answer is done, its slot is free and the long prompt joins at the
# very next step, next to the four still decoding. (The moment is set in steps, not seconds, so it comes at the same point
# of the run on any machine, however fast, or however busy with other work.)
#
# We size the long prompt for this device: the shortest prompt whose one-step prefill, by the
# calibrated formula, costs about eight plain decode steps (a few hundred tokens on a CPU; a
# GPU, where a small step is nearly all fixed cost, needs thousands).

# %%
NUM_RUNNING = 8 if ON_GPU else 4
# At most 1,024 tokens on a CPU, so the real-model runs stay short even if the fit is off.
prompt_len = long_prompt_len_for(cost, NUM_RUNNING, target_ratio=8.0, max_len=6000 if ON_GPU else 1024)
scenario = StallScenario(num_running=NUM_RUNNING, running_prompt_len=16,
                         running_output_len=96 if ON_GPU else 48, short_output_len=6,
                         long_prompt_len=prompt_len)
MAX_NUM_SEQS = scenario.max_num_seqs          # the running requests and the short one
backend = ModelBackend(lm, num_slots=MAX_NUM_SEQS, max_seq_len=scenario.max_seq_len)
requests = scenario.requests(tokenizer=lm.tokenizer)
decode_ms = 1e3 * cost.predict_features(NUM_RUNNING, NUM_RUNNING, NUM_RUNNING * 40)
print(f"{NUM_RUNNING} running requests ({scenario.running_output_len} tokens each); the newcomer "
      f"brings {prompt_len} prompt tokens. Predicted decode step: {decode_ms:.0f} ms")

# %% [markdown]
# First a control run without the newcomer. Each step decodes one token for each request, so
# their gaps are flat: this is what streaming looks like when nobody joins.

# %%
control = Engine(ContinuousBatcher(max_num_seqs=MAX_NUM_SEQS), backend).run(
    scenario.control_requests(lm.tokenizer), progress=True)
control_gaps = token_gaps(control)["gap"].dropna()

# %% [markdown]
# ## The stall, on the real model
#
# Now the same requests with the newcomer, under continuous batching **without** chunking:
# `chunked_prefill=False` computes a prompt in the step that admits it (the budget, vLLM's
# usual 2,048 tokens or more, holds it whole). The figure shows each running request's gap since
# its previous token, drawn over the time it spans: a stalled step is a tall block as wide as
# the step.

# %%
WHOLE_BUDGET = max(2048, prompt_len + NUM_RUNNING)


def batcher(budget, chunked_prefill=True):
    """This experiment's continuous batcher, with a token budget per step."""
    return ContinuousBatcher(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=budget,
                             chunked_prefill=chunked_prefill)


whole = Engine(batcher(WHOLE_BUDGET, chunked_prefill=False), backend).run(requests, progress=True)
whole_stall = stall_summary(whole, scenario.long_id)
plot_token_gaps(whole, scenario.long_id,
                title=f"Admitting a {prompt_len}-token prompt stalls every running request")
plt.show()

# %% [markdown]
# The steps around the admission, from the trace: the step that admitted the newcomer computed
# its whole prompt next to the decodes, and took several times as long as its neighbours.

# %%
# NBVAL_IGNORE_OUTPUT
steps = whole.steps_df()
admitted = int(steps.index[steps["num_prefill_tokens"] >= prompt_len][0])
around = steps.iloc[admitted - 2:admitted + 3].copy()
around["duration_ms"] = 1e3 * around["duration"]
around[["step", "num_seqs", "num_tokens", "num_prefill_tokens", "duration_ms"]].round(1)

# %%
# NBVAL_IGNORE_OUTPUT
pd.DataFrame({"control (no newcomer)": {"running_itl_median": control_gaps.median(),
                                        "running_itl_p90": control_gaps.quantile(0.9),
                                        "running_itl_max": control_gaps.max()},
              "whole prompt in one step": whole_stall[["running_itl_median", "running_itl_max",
                                                      "admission_gap"]]}).astype(float).round(3)

# %% [markdown]
# One number sums the stall up: `stall_ratio`, the admission gap over the running requests'
# median gap in the same run, i.e. how many of their usual gaps the freeze lasted. (Dividing by
# a run's own median also keeps two runs comparable when the machine's speed changes between
# them; the `_rel` columns below do the same.)

# %%
# The step that admits the prompt makes every running request wait several typical gaps.
assert whole_stall["stall_ratio"] >= 3, (
    f"the admission gap is only {whole_stall['stall_ratio']:.1f}x the median gap; expected >= 3x")
# And it is the newcomer that did it: in the control run, nine gaps in ten stay close to the
# median. (Each run against its own median: runs measured one after another on a shared
# machine may not run at the same speed.)
control_p90_rel = control_gaps.quantile(0.9) / control_gaps.median()
assert whole_stall["stall_ratio"] > 2 * control_p90_rel, (whole_stall, control_p90_rel)
print(f"admission step: {1e3 * whole_stall['admission_gap']:.0f} ms against a median gap of "
      f"{1e3 * whole_stall['running_itl_median']:.0f} ms ({whole_stall['stall_ratio']:.1f}x)")

# %% [markdown]
# A user streaming one of those answers sees the text freeze for a moment. The numbers most
# dashboards show hardly notice it: spread over some fifty gaps per request, the one long gap
# moves the mean gap (which TPOT and mean ITL report) a little and the median not at all. Here
# are the running requests' gaps in this run, with and without the step that admitted the
# prompt:

# %%
whole_gaps = token_gaps(whole)
running_gaps = whole_gaps[whole_gaps["request_id"] != scenario.long_id]
without = running_gaps[running_gaps["step_prefill_tokens"] < prompt_len]
with_vs_without = {stat: running_gaps["gap"].agg(stat) / without["gap"].agg(stat)
                   for stat in ("mean", "median", "max")}
print({stat: f"x{r:.2f}" for stat, r in with_vs_without.items()})
expect("running requests' max gap, with / without the admission step", with_vs_without["max"], above=2)
expect("their mean gap (TPOT), with / without it", with_vs_without["mean"], below=1.5)
expect("their median gap, with / without it", with_vs_without["median"], below=1.05)

# %% [markdown]
# Only the maximum tells. Now imagine a busy server where prompts arrive all the time: these
# freezes come again and again.
#
# (If your figure shows a spike somewhere else too, that is the machine: a step measured while
# another program had the CPU. Those spikes are why we compare runs by the gaps *while the
# newcomer's prompt is computed*: before and after it, all runs here do exactly the same work.)
#
# ## Chunked prefill: a token budget per step
#
# `ContinuousBatcher` plans each step from a budget of `max_num_batched_tokens` tokens (its rules,
# as in vLLM's scheduler): running requests that are decoding get one token each first; what is
# left of the budget goes to prompts, in pieces. Under a budget of 64 next to 4 decodes, a long
# prompt is computed 60 tokens at a time, over as many steps as that takes, and only its last
# piece samples its first token. Each of those steps costs a little more than a plain decode
# step, none of them a lot more.

# %%
CHUNK_BUDGET = 512 if ON_GPU else 64
chunked = Engine(batcher(CHUNK_BUDGET), backend).run(requests, progress=True)
chunked_stall = stall_summary(chunked, scenario.long_id)

fig, axes = plt.subplots(2, 1, figsize=(8, 6), sharex=True, sharey=True)
plot_token_gaps(whole, scenario.long_id, ax=axes[0], title="whole prompt in one step")
plot_token_gaps(chunked, scenario.long_id, ax=axes[1],
                title=f"chunked prefill, max_num_batched_tokens={CHUNK_BUDGET}")
fig.suptitle("Chunked prefill spreads the prompt: smaller gaps, for longer")
fig.tight_layout()
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
pd.DataFrame({"whole prompt": whole_stall, f"chunked ({CHUNK_BUDGET})": chunked_stall}).astype(float).round(3)

# %% [markdown]
# Each run is one sample: the whole prompt is computed in a single step, and one step can be
# slowed by anything else the machine does at that moment. Before we compare the two, we serve
# both twice more, taking turns, and compare each measure's median over the three runs. Each
# run is measured in units of its own typical decode step (`_rel`: divided by its median gap),
# in case the machine's speed changed between runs.

# %%
stall_runs = [{"run": "whole", **whole_stall}, {"run": "chunked", **chunked_stall}]
for _ in range(2):
    for name, policy in (("whole", batcher(WHOLE_BUDGET, chunked_prefill=False)),
                         ("chunked", batcher(CHUNK_BUDGET))):
        stall_runs.append({"run": name, **stall_summary(Engine(policy, backend).run(requests),
                                                        scenario.long_id)})
stall_medians = (pd.DataFrame(stall_runs).groupby("run")
                 [["prefill_itl_max_rel", "long_prefill_time_rel", "long_prefill_steps"]].median())
stall_medians.round(2)

# %%
med = stall_medians
# While the prompt is computed, chunking lowers the running requests' worst gap...
expect("worst gap while the prompt is computed, chunked / whole (medians of 3 runs)",
       med.loc["chunked", "prefill_itl_max_rel"] / med.loc["whole", "prefill_itl_max_rel"], below=0.8)
# ...by spreading the prompt over several steps...
assert chunked_stall["long_prefill_steps"] >= 3 and whole_stall["long_prefill_steps"] == 1
# ...so the newcomer's prompt takes longer to get through, and its first token comes later.
expect("the newcomer's prompt time, chunked / whole (medians of 3 runs)",
       med.loc["chunked", "long_prefill_time_rel"] / med.loc["whole", "long_prefill_time_rel"], above=1)
print(f"worst gap {1e3 * whole_stall['prefill_itl_max']:.0f} → "
      f"{1e3 * chunked_stall['prefill_itl_max']:.0f} ms; the newcomer's TTFT "
      f"{1e3 * whole_stall['long_ttft']:.0f} → {1e3 * chunked_stall['long_ttft']:.0f} ms")

# %% [markdown]
# Why is the newcomer slower? Its prompt's matrix work is the same in total (the same tokens,
# the same attention pairs), but every extra step pays the step's fixed cost again and waits for
# the decodes that share it. (How much that fixed cost weighs is this CPU's: here a step's fixed
# cost, the weight read plus per-step overhead, is worth a few dozen prompt tokens, so small
# budgets cost the newcomer dearly. On a GPU serving a model of billions of parameters the
# balance is different: a weight read is worth hundreds of prompt tokens of arithmetic, which is
# why GPU servers use budgets of 512 to 8,192 tokens. Carry the shape of the trade over, not this
# machine's numbers.) Chunking moves time from the running requests' worst gap to the
# newcomer's TTFT. (Its TTFT also holds its wait for a free slot, the same few steps in every
# run; `long_prefill_time` is the part that chunking changes.) That is the trade vLLM's chunked prefill (from the Sarathi-Serve work) makes
# on purpose: decodes are never held back behind a whole prompt.
#
# **Where it comes from: Sarathi-Serve.** Chunked prefill as servers use it today is from
# Agrawal et al., "Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve"
# (OSDI 2024). Its *stall-free batching* builds every step from the running decodes first, then
# fills the rest of a fixed token budget with a chunk of a waiting prompt, so a new prompt never
# pauses the decodes (the stall measured above). On a GPU the two halves fit together: a step of
# decodes alone is memory-bound (one weight read for a few tokens), so the decodes ride along a
# compute-bound prefill chunk almost for free, and the budget is set from the inter-token latency
# target. (On this CPU the decodes do not ride free: a step's cost grows with every token in it,
# as the calibrated formula shows.)
#
# **The other cure: prefill/decode disaggregation.** Instead of sharing steps at all, run the two
# phases on different devices: prefill machines compute prompts and hand each request's KV cache
# to decode machines that only stream tokens. **DistServe** (Zhong et al., OSDI 2024) sizes and
# parallelises each pool for its own target (TTFT for prefill, TPOT for decode) and reports
# goodput under both; **Splitwise** (Patel et al., ISCA 2024) splits the phases across machines,
# even of different hardware generations, since prefill wants arithmetic and decode wants memory
# bandwidth. Interference disappears by construction; the price is moving KV caches between
# machines and running two pools that must be balanced. Chunked prefill keeps one pool and
# bounds the interference instead.
#
# ## The trade: sweeping the budget
#
# How big should the budget be? We serve the same requests on the real model at two more
# budgets, and then every budget from tiny to "whole prompt" on the simulator, which runs the
# same scheduler with the calibrated step times. For each budget: the newcomer's TTFT and the
# running requests' largest gap while its prompt is computed.

# %%
REAL_BUDGETS = [256, 2048] if ON_GPU else [32, 128]
real_sweep = budget_sweep(backend, requests, REAL_BUDGETS, MAX_NUM_SEQS, long_id=scenario.long_id,
                          progress=True)
whole_row = {"max_num_batched_tokens": WHOLE_BUDGET, "chunked_prefill": False, **whole_stall.to_dict()}
chunk_row = {"max_num_batched_tokens": CHUNK_BUDGET, "chunked_prefill": True, **chunked_stall.to_dict()}
real_points = (pd.concat([real_sweep, pd.DataFrame([chunk_row, whole_row])], ignore_index=True)
               .astype({c: float for c in ("long_ttft", "prefill_itl_max", "prefill_itl_max_rel",
                                           "long_prefill_time_rel")})
               .sort_values(["chunked_prefill", "max_num_batched_tokens"], ascending=[False, True]))

# %%
sim = SimBackend(cost, kv_capacity_tokens=MAX_NUM_SEQS * scenario.max_seq_len,
                 max_seq_len=scenario.max_seq_len)
sim_requests = scenario.requests()            # the same scenario, simulated (lengths only)
SIM_BUDGETS = [b for b in (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
                           1536, 2048, 3072, 4096, 6144)
               if NUM_RUNNING < b <= 2 * (prompt_len + NUM_RUNNING)]
sim_sweep = budget_sweep(sim, sim_requests, SIM_BUDGETS, MAX_NUM_SEQS, long_id=scenario.long_id)

# %%
# NBVAL_IGNORE_OUTPUT
show = ["max_num_batched_tokens", "chunked_prefill", "long_prefill_steps", "long_ttft", "prefill_itl_max"]
print("real model:")
print(real_points[show].round(3).to_string(index=False))
print("simulator:")
print(sim_sweep[show].round(3).to_string(index=False))

# %%
fig, ax = plt.subplots(figsize=(7, 4.5))
ax.plot(1e3 * sim_sweep["prefill_itl_max"], 1e3 * sim_sweep["long_ttft"], marker="o",
        color="gray", label="simulator (calibrated)")
labelled = set()
for _, row in sim_sweep.iterrows():   # label each budget, once per distinct point
    point = (round(1e3 * row["prefill_itl_max"], 1), round(1e3 * row["long_ttft"], 1))
    if point not in labelled:
        labelled.add(point)
        ax.annotate(str(int(row["max_num_batched_tokens"])), point, textcoords="offset points",
                    xytext=(4, 4), fontsize=7, color="gray")
ax.scatter(1e3 * real_points["prefill_itl_max"], 1e3 * real_points["long_ttft"], marker="*", s=120,
           color="tab:red", zorder=3, label="real model")
ax.set_xlabel("running requests' worst gap while the prompt is computed (ms)")
ax.set_ylabel("newcomer's time to first token (ms)")
ax.set_yscale("log")
ax.grid(alpha=0.3)
ax.legend()
ax.set_title("A bigger token budget: the newcomer's first token sooner, everyone else's worst gap longer")
plt.show()

# %%
budgets, ttft, itl = (sim_sweep[c].to_numpy(dtype=float) for c in
                      ("max_num_batched_tokens", "long_ttft", "prefill_itl_max"))
# On the simulator a bigger budget never delays the newcomer's first token (fewer steps, each
# paying the fixed cost once)...
assert (np.diff(ttft) <= 1e-9).all(), sim_sweep[show]
# ...and the running requests' worst gap grows with it. (Up to 10%: a later piece of a prompt
# also attends to all the pieces before it, so it can cost about as much as a bigger first one.)
assert (np.diff(itl) >= -0.1 * itl[:-1]).all(), sim_sweep[show]
assert ttft[0] > 3 * ttft[-1] and itl[-1] > 3 * itl[0], sim_sweep[show]
# The real model shows the same trade at its smallest budget against no chunking at all
# (in units of each run's own decode step, as above).
smallest = real_points.iloc[0]
assert smallest["prefill_itl_max_rel"] < med.loc["whole", "prefill_itl_max_rel"], real_points
assert smallest["long_prefill_time_rel"] > med.loc["whole", "long_prefill_time_rel"], real_points
print(f"simulator, budget {int(budgets[0])} → {int(budgets[-1])}: newcomer TTFT "
      f"{1e3 * ttft[0]:.0f} → {1e3 * ttft[-1]:.0f} ms, running worst gap "
      f"{1e3 * itl[0]:.0f} → {1e3 * itl[-1]:.0f} ms")

# %% [markdown]
# Read the curve from the left. Tiny budgets keep the running requests' gaps at their usual
# size, but the prompt crawls in over dozens of steps, each paying the fixed cost again: the
# newcomer waits many times longer for its first token. Large budgets give the newcomer its
# first token almost as soon as possible, and freeze the others for the whole prefill. Once
# the budget holds the whole prompt, nothing changes any more.
#
# How to choose: start from the latency target of the running requests (say "no gap above
# twice the usual decode step") and take the **largest** budget that meets it; every token of
# budget beyond that point is paid by the streaming users, every token below it by the
# newcomers. vLLM exposes the same knob as `max_num_batched_tokens` (and
# `long_prefill_token_threshold` caps how much of one step a single prompt may take, so several
# long prompts share the budget instead of queueing behind each other).
#
# The simulator is a model: on the real machine individual steps are noisier (the red stars sit
# near, not on, the curve), but the direction and the size of the trade agree.

# %% [markdown]
# ## On a GPU: the same knob, another reason
#
# Everything above was measured on this device and simulated with a formula fitted to it, where
# a step's time is a sum with a large fixed part: every chunk pays it again, so each cut delays
# the newcomer. On a GPU, by the datasheet's roofline (notebook 01), a step costs the slower of
# reading the weights and doing the FLOPs. A decode step is memory-bound; a prompt chunk of a few
# hundred tokens is already compute-bound, and from there on its time is proportional to its
# tokens, so cutting the prompt into such chunks would cost the newcomer almost nothing. Only
# chunks below the ridge (where FLOPs per weight byte equal the device's peak over bandwidth)
# pay a full weight read each.
#
# Measured kernels temper that (notebook 01's last figure): past the ridge they still run below
# their compute roof and turn towards it slowly, each kernel has a fixed cost, and a server
# spends some CPU time per step. Notebook 14's **step model** has all three: Llama-3-8B as
# `vllm serve` runs it on an H100 (`VllmReplica(...).step_model`), each kernel as vLLM's kernels
# were measured on real H100s, CUDA-graph padding, and the engine's CPU work per step, which
# vLLM's async scheduling overlaps with the GPU's. Beside it, as a contrast, the bare datasheet
# roofline (`RooflineCostModel.for_device(..., grounded=False)`: no kernel is slower than its
# roof, nothing else costs anything). The same sweep on the simulator with both, an 8B model,
# eight running requests and a 4,096-token newcomer:

# %%
gpu = VllmReplica("Llama-3-8B", "H100").step_model                               # measured vLLM kernels
datasheet = RooflineCostModel.for_device("Llama-3-8B", "H100", grounded=False)  # the bare roofline, a contrast
gpu_scenario = StallScenario(num_running=8, running_prompt_len=16, running_output_len=96,
                             short_output_len=6, long_prompt_len=4096)


def gpu_budget_sweep(model):
    """The budget sweep of the GPU scenario on a simulator with `model`'s step times."""
    backend = SimBackend(model, kv_capacity_tokens=gpu_scenario.max_num_seqs * gpu_scenario.max_seq_len,
                         max_seq_len=gpu_scenario.max_seq_len)
    return budget_sweep(backend, gpu_scenario.requests(), [32, 64, 128, 256, 512, 1024, 2048, None],
                        gpu_scenario.max_num_seqs, long_id=gpu_scenario.long_id)


gpu_sweep, datasheet_sweep = gpu_budget_sweep(gpu), gpu_budget_sweep(datasheet)
print(gpu)
print(gpu_sweep[show].round(4).to_string(index=False))

# %% [markdown]
# Each device against its own whole-prompt run: the newcomer's TTFT and the others' worst gap
# as the budget shrinks, in chunks per prompt (8 chunks is a budget of 512 tokens on the GPU).

# %%
def relative_to_whole(sweep: pd.DataFrame, prompt_tokens: int) -> pd.DataFrame:
    whole_run = sweep.iloc[-1]                           # the largest budget: the prompt in one step
    return pd.DataFrame({"chunks": prompt_tokens / sweep["max_num_batched_tokens"],
                         "ttft": sweep["long_ttft"] / whole_run["long_ttft"],
                         "worst_gap": sweep["prefill_itl_max"] / whole_run["prefill_itl_max"]})


devices = {f"this {lm.device} (fitted formula), {prompt_len}-token prompt": relative_to_whole(sim_sweep, prompt_len),
           "H100 step model, 8B model, 4,096-token prompt": relative_to_whole(gpu_sweep, 4096),
           "H100 datasheet roofline, same": relative_to_whole(datasheet_sweep, 4096)}
fig, axes = plt.subplots(1, 2, figsize=(12, 4))
for (label, rel), style in zip(devices.items(), ("o-", "s-", "^:")):
    axes[0].plot(rel["chunks"], rel["ttft"], style, label=label)
    axes[1].plot(rel["chunks"], rel["worst_gap"], style, label=label)
for ax, what in zip(axes, ("newcomer's TTFT", "running requests' worst gap")):
    ax.set(xscale="log", xlabel="chunks the prompt is cut into", ylabel=f"{what}, × whole prompt")
    ax.grid(alpha=0.3)
axes[0].legend(fontsize=8)
fig.suptitle("What cutting a prompt in pieces costs the newcomer, on this CPU and on an H100")
fig.tight_layout()
plt.show()

# %% [markdown]
# How much the measured kernels move the GPU's figures: the newcomer's whole prompt in one step
# takes 1.3 to 1.9 times as long as the datasheet's roofline says (the kernels reach under four
# fifths of the datasheet's peak on a prompt this long); cutting it into 8 chunks of 512 tokens
# costs the newcomer a few percent more on the datasheet's roofline, and somewhat more with the
# measured kernels, yet well under a third more on both. The running requests' worst gap shrinks
# to about a fifth or less on both.

# %%
cpu_rel, gpu_rel, datasheet_rel = devices.values()
whole_ratio = gpu_sweep["long_ttft"].iloc[-1] / datasheet_sweep["long_ttft"].iloc[-1]
pairs = 4096 * 4097 // 2                                  # the whole prompt's attention pairs
flops_share = datasheet.compute_seconds(4096, pairs) / gpu.gpu_seconds(1, 4096, pairs)
print(f"whole prompt: newcomer TTFT {gpu_sweep['long_ttft'].iloc[-1] * 1e3:.0f} ms with the step model, "
      f"{datasheet_sweep['long_ttft'].iloc[-1] * 1e3:.0f} ms on the datasheet roofline (x{whole_ratio:.2f}); "
      f"the kernels' FLOPs at {flops_share:.0%} of the datasheet peak")
expect("predicted for an H100, whole prompt: newcomer's TTFT, step model / datasheet", whole_ratio, above=1.3,
       below=1.9)
expect("predicted for an H100: a 4,096-token step's FLOPs, share of the datasheet peak", flops_share, below=0.8)
cpu_8, gpu_8, datasheet_8 = (rel.iloc[(rel["chunks"] - 8).abs().argmin()] for rel in devices.values())
print(f"8 chunks: newcomer TTFT x{cpu_8['ttft']:.2f} on this {lm.device}, x{gpu_8['ttft']:.2f} with the H100 "
      f"step model (x{datasheet_8['ttft']:.2f} on the datasheet roofline); others' worst gap "
      f"x{gpu_8['worst_gap']:.2f} (x{datasheet_8['worst_gap']:.2f})")
# On the datasheet roofline, 512-token chunks are past the ridge: 8 of them cost the newcomer a
# few percent more than one whole step. With measured kernels, more, but under a third.
expect_true("H100 datasheet roofline: a 512-token chunk is past the ridge",
            datasheet.bound(1, 512, 512 * 2048) == "compute")
expect("8 chunks, H100 datasheet roofline: newcomer's TTFT x", datasheet_8["ttft"], below=1.1)
expect("8 chunks, H100 step model: newcomer's TTFT x, over the datasheet's", gpu_8["ttft"] / datasheet_8["ttft"],
       above=1.0)
expect("8 chunks, H100, both: newcomer's TTFT x", [gpu_8["ttft"], datasheet_8["ttft"]], below=4 / 3)
# Either way the others' worst gap shrinks to about a fifth or less...
expect("8 chunks, H100, both: others' worst gap x", [gpu_8["worst_gap"], datasheet_8["worst_gap"]], below=0.25)
# ...and below the ridge each chunk pays a full weight read: 32-token chunks, 128 of them, >3x.
expect("128 chunks, H100, both: newcomer's TTFT x", [gpu_rel["ttft"].iloc[0], datasheet_rel["ttft"].iloc[0]],
       above=3)
# On this CPU's fitted formula every step pays the fixed cost, so 8 chunks cost the newcomer too.
expect(f"8 chunks, this {lm.device}: newcomer's TTFT x", cpu_8["ttft"], above=1.05)

# %% [markdown]
# How far to trust the step model's price for 512-token chunks? Two sets of measured kernels
# answer it for one layer's matrix multiplies and small operators (attention aside): vLLM's, as
# AIConfigurator measured them on an H100 (the step model's), and Vidur's 2024 profile of
# Llama-2-7B's layer on an H100, eight passes of 512 tokens against one of 4,096. Both sizes are
# past the ridge, so the datasheet's roofline prices them the same. Both measurements say the
# eight passes take longer, by different amounts: the libraries pick another tiling from one size
# to the next (notebook 01's figure shows the saw-tooth), and the two were measured two years
# and several library versions apart. So read the step model's 8-chunk price to within about
# a tenth, not as exact.

# %%
vidur_layer = compare_profile(read_kernel_profile(KERNEL_PROFILES_DIR / "h100_Llama-2-7b-hf.csv"),
                              load_device_presets()["H100"].kernel_model()).query("tensor_parallel == 1")
vidur_ms = vidur_layer.set_index("num_tokens")["measured_ms"]
vllm_layers = VllmReplica("Llama-2-7B", "H100").step_model.gpu        # measured vLLM kernels, every layer
eight_vs_one = {"Vidur, 2024": 8 * vidur_ms[512] / vidur_ms[4096],
                "vLLM (AIConfigurator)": 8 * vllm_layers.layers_seconds(512) / vllm_layers.layers_seconds(4096)}
print("one H100 layer, 8 x 512 tokens / 1 x 4,096:",
      ", ".join(f"{k} x{v:.2f}" for k, v in eight_vs_one.items()), "; datasheet roofline x1.00")
expect("data: H100 layer, 8 x 512 / 1 x 4,096 tokens, both measurements", list(eight_vs_one.values()),
       above=1.0, below=1.25)

# %% [markdown]
# So the advice to "take the largest budget that meets the running requests' target" holds on
# both, but for different reasons and with different prices. On this CPU every chunk costs a
# fixed overhead, so by the fitted formula chunking always costs the newcomer (and the medians
# of the real runs above agree). On a GPU, budgets above the ridge
# (a few hundred tokens for bf16 on an H100) are far cheaper for the newcomer than budgets below
# it, where each chunk pays a whole weight read; but they are not free, as the datasheet's
# roofline suggests: each chunk pays its kernels' fixed costs and their slow turn onto their
# compute roof, and each later chunk's attention re-reads the keys of the chunks before it. This
# is why vLLM's defaults sit at hundreds to thousands of tokens. Sarathi-Serve picks its budget
# the way this notebook's advice does: from the time-between-tokens target, as the largest
# budget whose steps, profiled on the device, stay within it.
#
# ## Explorer: the token budget
#
# The slider re-runs the experiment on the simulator with your budget and redraws the running
# requests' gaps, with the budget's point on the trade curve.

# %%
def show_budget(max_num_batched_tokens=64):
    """Gaps of the running requests, and the trade curve, at one token budget (simulator)."""
    row = budget_sweep(sim, sim_requests, [max_num_batched_tokens], MAX_NUM_SEQS, long_id=scenario.long_id)
    trace = row.attrs["traces"][max_num_batched_tokens]
    fig, (ax_gaps, ax_trade) = plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [3, 2]})
    plot_token_gaps(trace, scenario.long_id, ax=ax_gaps,
                    title=f"max_num_batched_tokens={max_num_batched_tokens}: "
                          f"{int(row['long_prefill_steps'].iloc[0])} prefill steps")
    ax_trade.plot(1e3 * sim_sweep["prefill_itl_max"], 1e3 * sim_sweep["long_ttft"], color="gray",
                  marker=".")
    ax_trade.scatter(1e3 * row["prefill_itl_max"], 1e3 * row["long_ttft"], s=120, marker="*",
                     color="tab:red", zorder=3)
    ax_trade.set_yscale("log")
    ax_trade.set_xlabel("running requests' worst gap (ms)")
    ax_trade.set_ylabel("newcomer's TTFT (ms)")
    ax_trade.grid(alpha=0.3)
    ax_trade.set_title(f"TTFT {1e3 * row['long_ttft'].iloc[0]:.0f} ms, "
                       f"worst gap {1e3 * row['prefill_itl_max'].iloc[0]:.0f} ms")
    fig.tight_layout()
    return fig

# %%
fig = show_budget(max_num_batched_tokens=CHUNK_BUDGET)
plt.show()

# %%
explore(show_budget, max_num_batched_tokens=(NUM_RUNNING + 4, 2 * (prompt_len + NUM_RUNNING), 4))

# %% [markdown]
# ## Summary
#
# - A step lasts as long as all the tokens it computes. When continuous batching admits a long
#   prompt whole, the running requests get their next token only after the prefill: on the real
#   model their gap at the admission step was several times their median gap, while their mean
#   gap (TPOT) moved a little and their median not at all (watch the maximum, not the mean).
# - Chunked prefill computes a prompt in pieces under a per-step token budget, decodes first.
#   The running requests' worst gap dropped; the newcomer's first token came later, because
#   every extra step pays the fixed cost again.
# - The budget sets the trade between the newcomer's TTFT and the running requests' ITL; the
#   calibrated simulator draws the whole curve and the real model agrees at the points we
#   measured. Choose the largest budget that keeps the running requests within their target.
#
# Next: the metrics in full (TTFT, TPOT, ITL, E2E, their percentiles), and which phase each one
# measures.

# %% [markdown]
# ## Exercises
#
# Worked solutions are in `solutions/06_prefill_stalls_and_chunked_prefill.py`.
#
# **06.1** Six requests are decoding when a request with a 500-token prompt is admitted, under
# `ContinuousBatcher(max_num_batched_tokens=48)`. The six keep decoding all along. In how many steps
# is the prompt computed (counting the step that samples its first token)? Work it out from the
# scheduler's rules, then check it on a simulator with
# `StallScenario(num_running=6, long_prompt_len=500)` (served with
# `max_num_seqs=scenario.max_num_seqs`) and `stall_summary`.

# %%
answer = None  # your code here
check("06.1", answer)

# %% [markdown]
# **06.2** Tune for a latency target. On a simulator with the cost model
# `CostModel(fixed_s=0.040, per_seq_s=0.004, per_token_s=0.0006, per_attention_pair_s=2e-8)`
# (roughly this course's CPU), serve `StallScenario().requests()` with
# `max_num_seqs=scenario.max_num_seqs`. The other requests must never wait more than 110 ms
# between two tokens, over the whole run. Which is the **largest** budget among
# `[16, 32, 48, 64, 96, 128, 192, 256, 512]` that meets the target?

# %%
answer = None  # your code here
check("06.2", answer)

# %% [markdown]
# **06.3** Measure it yourself. Write a function `worst_running_gap(trace, long_id)` that returns
# the largest gap (seconds) between two successive tokens of any request *other than* `long_id`,
# using only `trace.requests` (each record has `request_id` and `visible_token_times`). The
# checker runs your function on traces of its own and compares it with `stall_summary`.

# %%
answer = None  # your code here: answer = worst_running_gap
check("06.3", answer)
