# %% [markdown]
# # 14 · Before you rent the GPUs: predict a whole vLLM deployment
#
# A question that comes before any benchmark: "Llama-3-8B on H100s, at 30 requests a second with
# my prompt lengths: what time to first token and time per output token will vLLM give me, and
# should the second GPU split the model or serve a second copy of it?" Renting the GPUs to find
# out costs money and days. This notebook answers it on this laptop-sized machine, with the
# pieces the course built: kernels measured on real GPUs (notebook 01), the continuous-batching
# engine (notebook 04), paged KV memory (notebook 05), chunked prefill (notebook 06), the
# metrics (notebook 07) and the cluster (notebook 12), assembled into `batchlab.predict`.
#
# ## What you will learn
#
# - **How vLLM sizes its KV cache** on each GPU, term by term, and how many sequences that holds.
# - **What splitting a model costs**: *tensor parallelism* (TP) cuts every layer across GPUs,
#   which then sum their partial results (an *all-reduce*) twice per layer; a step gets faster,
#   but not twice as fast.
# - **Why a mixture of experts wants a larger batch**: a decode step of Mixtral-8x7B reads only
#   the experts its tokens chose, so its weights are amortised only once the batch touches them all.
# - **Three ways to use two GPUs** (one GPU, TP2, two replicas) at rising load: which answers
#   faster, which carries more, and how the latency target decides between them.
# - **What a million tokens costs** on each, from the price per GPU-hour you type in.
# - **How far to trust the prediction**: what it was checked against, where it is right and
#   where it is not.
#
# Everything here is a prediction for GPUs, made by the simulator: the kernels are vLLM's own,
# timed on H100, H200 and A100 GPUs by NVIDIA's AIConfigurator (its performance database ships in
# the package `aiconfigurator-core`), the engine around them comes from vLLM V1's code and
# published measurements. Nothing here measures this CPU.

# %% [markdown]
# ## Setup

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

# %%
from batchlab.analysis.claims import expect
from batchlab.analysis.widgets import explore
from batchlab.steptime.kernel_profiles import (KERNEL_PROFILES_DIR, compare_profile, compare_projections, error_summary,
                                               read_kernel_profile)
from batchlab.steptime.device_presets import device_preset
from batchlab.exercises import check
from batchlab.predict import Deployment, EngineArgs, TrafficSpec, predict
from batchlab.vllm_sim.memory import GIB
from batchlab.predict.planning import best_rate, capacity, cost_per_million_tokens, sweep_rates

# %% [markdown]
# ## A deployment, checked the way vLLM checks it
#
# A `Deployment` is what you would type to start vLLM: the model, the GPU, `--tensor-parallel-size`,
# how many replicas (`data_parallel_size`) and vLLM's own flags under vLLM's names. Flags you
# leave out take vLLM V1's defaults for that GPU (on an H100 `vllm serve` allows 1,024 sequences
# and 8,192 tokens per step; on an A100, 256 and 2,048). Building one does what vLLM does at
# start: it checks the model splits evenly, that the weights fit, and sizes the KV cache.

# %%
llama8b = Deployment("Llama-3-8B", "H100")
print("\n".join(llama8b.describe()))

# %% [markdown]
# vLLM gives the KV cache what is left of `--gpu-memory-utilization` (90%) of the memory CUDA
# reports after three things: the weights on this GPU, the peak of one profiling forward pass
# at the full token budget, and memory outside PyTorch (CUDA's context, and with TP the
# communication buffers). The rest becomes blocks of 16 tokens. vLLM's own log for this model
# on an H100 (with 256 sequences and 8,192 tokens per step) reads "available_kv_cache_memory
# 53.29GiB"; the same setting here. Two of the plan's terms were read off that same kind of log
# (the 90% CUDA reports as visible, the memory outside PyTorch), so this check tests the rest:
# the weights' bytes and the profiling pass's peak.

# %%
logged = Deployment("Llama-3-8B", "H100", args=EngineArgs(max_num_seqs=256, max_num_batched_tokens=8192)).memory
print(f"KV cache {logged.kv_bytes / GIB:.2f} GiB per GPU = {logged.num_blocks:,} blocks")
expect("check on the memory plan against vLLM's log (two of its terms came from such logs): the KV cache is "
       "the logged 53.29 GiB within 1%", logged.kv_bytes / GIB / 53.29 - 1, above=-0.01, below=0.01)

# %% [markdown]
# A picture of one GPU's memory for three deployments: the 8B model on one GPU, and Llama-2-70B
# split over two and over four. The 70B model's weights alone (128 GiB) do not fit on one
# 80 GB card. vLLM would find out while loading them (a CUDA out-of-memory error); the predictor
# refuses the deployment before you rent anything, and says which TP degree would fit.

# %%
try:
    Deployment("Llama-2-70B", "H100")
except ValueError as err:
    print(err)
plans = {"Llama-3-8B, TP1": llama8b.memory, "Llama-2-70B, TP2": Deployment("Llama-2-70B", "H100", 2).memory,
         "Llama-2-70B, TP4": Deployment("Llama-2-70B", "H100", 4).memory}
parts = {name: {"weights": p.weights, "activations": p.activation, "outside PyTorch": p.non_torch,
                "KV cache": p.kv_bytes, "headroom": p.visible - p.usable} for name, p in plans.items()}
table = pd.DataFrame(parts).T / GIB
table.plot.barh(stacked=True, figsize=(8, 2.6)).legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
kv_share = table["KV cache"] / table.sum(axis=1)
plt.title(f"The KV cache gets {kv_share.min():.0%}-{kv_share.max():.0%} of each GPU")
plt.xlabel("GiB per GPU")
plt.show()

# %% [markdown]
# How many sequences the cache holds is what bounds the batch (notebook 05). At 1,250 tokens a
# sequence (a 1,000-token prompt and 250 answered):

# %%
for name, p in plans.items():
    print(f"{name}: {p.kv_tokens:,} KV tokens per replica = {p.kv_tokens // 1250:,} sequences of 1,250 tokens")
kv_ratio = plans["Llama-2-70B, TP4"].kv_tokens / plans["Llama-2-70B, TP2"].kv_tokens
print(f"Llama-2-70B: TP4 holds {kv_ratio:.0f}x the KV tokens of TP2 per replica")
tp2, tp4 = plans["Llama-2-70B, TP2"], plans["Llama-2-70B, TP4"]
print(f"Llama-2-70B per GPU: weights {tp2.weights / GIB:.0f} GiB at TP2 and {tp4.weights / GIB:.0f} GiB at TP4, "
      f"of {tp2.usable / GIB:.0f} usable GiB")
expect("arithmetic on the memory plans: Llama-2-70B at TP4 holds over 10x the KV tokens of TP2 (at TP2 the "
       "weights nearly fill both GPUs)", kv_ratio, above=10)

# %% [markdown]
# Twice the GPUs, many times the room: at TP2 each GPU holds most of its usable memory in the
# 70B model's weights (printed above), so only a sliver is left for the cache; at TP4 the weights
# take half as much and the cache gets the rest. A deployment that barely fits its weights can barely batch.

# %% [markdown]
# ## What one step costs when the model is split
#
# With TP2 each GPU holds half of every weight matrix and half of the attention heads, so it
# reads half the bytes per step. But after the attention's output projection and after the MLP,
# each GPU holds a *partial* sum of the layer's output; the GPUs add them up over NVLink (an
# all-reduce) before the next layer can start: 64 small transfers per step for a 32-layer
# model. The predictor prices them from vLLM's own all-reduce kernel as measured inside a CUDA
# graph (a few microseconds for a decode step's small message), and as measured without one for
# steps larger than vLLM captured graphs for, where each call costs about four times as much.

# %%
batch = [1, 8, 32, 64, 128, 256]
context = 1200                                  # tokens each sequence attends to
steps = {}
for name, tp in (("TP1", 1), ("TP2", 2)):
    model = Deployment("Llama-3-8B", "H100", tp).step_model
    steps[name] = [model.gpu_seconds(b, b, b * context) * 1e3 for b in batch]
tp2 = Deployment("Llama-3-8B", "H100", 2).step_model.gpu
share = [2 * tp2.shape.num_layers * tp2.all_reduce_seconds(b) * 1e3 / ms for b, ms in zip(batch, steps["TP2"])]
speedup = np.array(steps["TP1"]) / np.array(steps["TP2"])
print(pd.DataFrame({"TP1 ms": steps["TP1"], "TP2 ms": steps["TP2"], "TP1 / TP2": speedup,
                    "all-reduce share of TP2": share}, index=pd.Index(batch, name="decode batch")).round(2))

# %%
expect("check on the stored kernel tables: TP2 makes a decode step faster, but less than twice as fast", speedup,
       above=1.2, below=1.9)
expect("check on the stored kernel tables: the all-reduces take a visible share of a TP2 step", np.array(share),
       above=0.03)

# %% [markdown]
# ## A mixture of experts: the batch must be larger
#
# Mixtral-8x7B replaces each layer's MLP by 8 *experts* (each an MLP of Llama's shape) and a
# router that sends every token to 2 of them. Per token it computes like a 13B model, but it
# holds 47B parameters. A decode step reads the weights of every expert that *some* token of the
# batch chose: one sequence touches 2 experts, a few sequences already touch all 8. vLLM's fused
# MoE kernel, timed at each number of tokens (Mixtral at TP2, each GPU holding half of every
# expert), next to dense MLPs of the same shape holding the 2 active experts' weights and all 8:

# %%
mixtral = Deployment("Mixtral-8x7B", "H100", 2, args=EngineArgs(max_model_len=4096)).step_model.gpu
tables, tp, h, inter = mixtral.tables, 2, mixtral.shape.hidden_size, mixtral.shape.moe.intermediate_size


def dense_mlp_us(tokens: int, experts: int) -> float:
    """A dense gated MLP as wide as `experts` experts, split over `tp` GPUs (measured GEMMs)."""
    width = experts * inter // tp
    return (tables.gemm_seconds(tokens, 2 * width, h) + tables.gemm_seconds(tokens, h, width)) * 1e6


tokens = [1, 2, 4, 8, 16, 32, 64, 128, 256]
mlp = pd.DataFrame({"MoE layer": [mixtral.mlp_seconds(t) * 1e6 for t in tokens],
                    "dense, 2 experts' weights": [dense_mlp_us(t, 2) for t in tokens],
                    "dense, 8 experts' weights": [dense_mlp_us(t, 8) for t in tokens]},
                   index=pd.Index(tokens, name="tokens in the step")).round(1)
print(mlp)

# %%
full = mlp["MoE layer"].loc[64]
all_from = int(min(t for t in tokens if mlp["MoE layer"].loc[t] > 0.85 * full))
fig, ax = plt.subplots(figsize=(6.5, 3.4))
for column in mlp:
    ax.plot(tokens, mlp[column] / np.array(tokens), marker="o", label=column)
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("decode batch (tokens in the step)")
ax.set_ylabel("MLP time per token (us), one layer")
ax.legend()
ax.set_title(f"From {all_from} tokens on, Mixtral's MoE layer costs what reading all 8 experts does:\n"
             "its time per token falls only as the batch grows past that")
plt.tight_layout()
plt.show()

# %% [markdown]
# At one token the MoE layer costs about what its 2 active experts' weights take to read; from a
# handful of tokens on it costs about what all 8 do, flat, until the batch is large enough for
# compute to matter. So the time per token that a dense model of the active size reaches at a
# small batch, the mixture reaches only at a batch several times larger: at light load each step
# reads most of its 47B parameters, and its economy (13B's compute per token) appears only when
# the server is busy enough to fill a large batch.

# %%
per_token = mlp.div(np.array(tokens), axis=0)
need = int(min((t for t in tokens if per_token["MoE layer"].loc[t] <= per_token["dense, 2 experts' weights"].loc[8]),
               default=tokens[-1]))
print(f"the MoE layer reaches the dense-active MLP's time per token at batch 8 only at batch {need}")
expect("check on the stored kernel tables: at one token the MoE layer costs under half of its cost at 64 tokens "
       "(it reads 2 of 8 experts)",
       mlp["MoE layer"].loc[1] / full, below=0.5)
expect("check on the stored kernel tables: from 8 to 64 tokens the MoE layer's time stays within 15% of its "
       "64-token time (every expert read)",
       mlp["MoE layer"].loc[[8, 16, 32, 64]].to_numpy() / full - 1, above=-0.15, below=0.15)
expect("check on the stored kernel tables: the MoE layer needs a batch at least 3x larger to match the "
       "dense-active MLP's time per token at batch 8",
       need / 8, above=3)

# %% [markdown]
# ## Three ways to use two GPUs
#
# The traffic: chat-like requests, 200 tokens of a system prompt shared by each of four groups,
# 800 tokens of their own, 250 tokens answered, arriving as a Poisson process (notebook 08). The
# candidates: one GPU; two GPUs as TP2 (one faster replica); two GPUs as two TP1 replicas behind
# a router that sends each request to the replica with the fewest outstanding ones (notebook 12).
# Each rate is 30 simulated seconds of traffic, thousands of requests over all the runs.
#
# A deployment *saturates* at a rate when it serves less than arrives, so its queue grows for as
# long as the traffic lasts. The predictor calls a run saturated when the time requests wait in
# the queue grows by more than 0.02 s per second of arrivals and the last fifth of them waited
# over half a second at the median (`batchlab.predict.report`); a saturated run has no steady
# latency to quote, so its points are left off the plots.
#
# Against measured vLLM runs (the end of this notebook) the predictor's TPOT and end-to-end
# medians came within 10% at TP1, TP2 and TP4 alike, and its time to first token 6-15 ms low (the
# API server's work, not modelled), so the comparison below holds as far as those errors do.

# %%
candidates = {"1 GPU: TP1": llama8b, "2 GPUs: TP2": Deployment("Llama-3-8B", "H100", 2),
              "2 GPUs: 2 x TP1": Deployment("Llama-3-8B", "H100", data_parallel_size=2)}


def chat_traffic(rate: float) -> TrafficSpec:
    return TrafficSpec(num_prompts=int(rate * 30), request_rate=rate, input_len=800, output_len=250,
                       prefix_len=200, num_prefix_groups=4, seed=0)


rates = [4, 12, 20, 28, 36, 44, 52, 60, 68]
sweep = sweep_rates(candidates, chat_traffic, rates, progress=True)

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
for name, group in sweep.groupby("candidate", sort=False):
    keeps = group[~group["saturated"]]
    axes[0].plot(keeps["rate"], keeps["tpot_p90_ms"], marker="o", label=name)
    axes[1].plot(keeps["rate"], keeps["ttft_p90_ms"], marker="o", label=name)
axes[0].set_ylabel("TPOT p90 (ms)")
axes[1].set_ylabel("TTFT p90 (ms)")
for ax in axes:
    ax.set_xlabel("offered load (requests/s)")
axes[0].legend()
low = sweep[sweep["rate"] == rates[0]].set_index("candidate")["tpot_p50_ms"]
fig.suptitle(f"At light load TP2 streams {low['2 GPUs: 2 x TP1'] / low['2 GPUs: TP2']:.1f}x faster than two "
             "replicas;\nthe replicas keep up to a higher load (each line stops where its deployment saturates)")
plt.tight_layout()
plt.show()

# %% [markdown]
# Read the two panels together. TP2 halves each GPU's weight reads, so every step is shorter and
# every user streams faster, most visibly when the load is light. Two replicas do not make any
# step shorter; they run two batches at once, each half as full, so they carry more before the
# queue starts to grow. Why TP2 carries less at high load: its steps are shorter only while they
# read weights; once a busy step computes, each GPU does half the FLOPs but still pays the two
# all-reduces per layer and every kernel's fixed cost, while two replicas pay none of that.
# Which is "better" is the latency target's call: a target on the time per output token (TPOT,
# notebook 07) is a budget each step must fit, and a tight one only the faster steps meet.

# %% [markdown]
# The sweep's rates are 8 requests a second apart, so a deployment's highest rate under a target
# lies between its last passing rate and the next. `capacity` narrows that by bisection, to 3%
# of the rate (a few more predictions per deployment; about a minute in all):

# %%
targets = {"TPOT p90 < 50 ms": {"ttft_p90_ms": 500, "tpot_p90_ms": 50},
           "TPOT p90 < 10 ms": {"ttft_p90_ms": 500, "tpot_p90_ms": 10}}
found = {}
for target, slo in targets.items():
    grid = best_rate(sweep, slo)["best_rate"]
    for name, deployment in candidates.items():
        start = grid[name]                         # the sweep saw `start` meet the target, the next rate miss it
        bracketed = start == start and start < rates[-1]
        low_rate, high_rate = (start, start + 8) if start == start else (0.5, rates[0])
        found[target, name] = capacity(deployment, chat_traffic, slo, low=low_rate, high=high_rate,
                                       bracketed=bracketed)
capacities = pd.DataFrame({t: {n: found[t, n]["rate"] for n in candidates} for t in targets})
print(capacities.round(1).astype(str) + pd.DataFrame({t: {n: "+" if found[t, n]["capped"] else "" for n in candidates}
                                                      for t in targets}))
loose, tight = capacities["TPOT p90 < 50 ms"], capacities["TPOT p90 < 10 ms"]
expect("predicted: under a loose target two replicas carry more than TP2",
       loose["2 GPUs: 2 x TP1"] / loose["2 GPUs: TP2"], above=1)
expect("predicted: under a tight target TP2 carries more than two replicas",
       tight["2 GPUs: TP2"] / tight["2 GPUs: 2 x TP1"], above=1)
expect("predicted: at light load TP2's TPOT is under 0.8 of two replicas'",
       low["2 GPUs: TP2"] / low["2 GPUs: 2 x TP1"], below=0.8)

# %% [markdown]
# ## What a million tokens costs
#
# A GPU bills by the hour whether it is busy or not, so the cost of a token is the GPUs' price
# divided by the tokens they make in that hour: at the highest rate each deployment sustains
# under your target, that is the cheapest it gets. Type in what a GPU-hour costs you (the
# number below is only an example):

# %%
USD_PER_GPU_HOUR = 2.50
costs = pd.DataFrame({t: {n: cost_per_million_tokens(found[t, n]["num_gpus"], USD_PER_GPU_HOUR,
                                                     found[t, n]["output_tok_s"])
                          for n in candidates if found[t, n]["rate"] > 0} for t in targets})
costs.plot.barh(figsize=(7, 2.6))
cheapest = costs.idxmin()
plt.title(f"Cheapest per token: {cheapest.iloc[0]} under the loose target, {cheapest.iloc[1]} under the tight one")
plt.xlabel(f"$ per million output tokens at ${USD_PER_GPU_HOUR:.2f} per GPU-hour")
plt.show()

# %% [markdown]
# Per GPU, one TP1 replica at its own highest rate costs about what two of them do: replicas
# scale a deployment, they hardly make a token cheaper. TP2 costs more per token under the loose
# target (its second GPU buys speed the target did not ask for) and less under the tight one,
# where a single TP1 GPU can serve only a trickle.

# %%
loose_cost, tight_cost = costs["TPOT p90 < 50 ms"], costs["TPOT p90 < 10 ms"]
expect("predicted: loose target: one TP1 GPU costs within 15% of two replicas per token (the router wastes little)",
       loose_cost["1 GPU: TP1"] / loose_cost["2 GPUs: 2 x TP1"] - 1, above=-0.15, below=0.15)
expect("predicted: loose target: TP2 costs more per token than two replicas",
       loose_cost["2 GPUs: TP2"] / loose_cost["2 GPUs: 2 x TP1"], above=1)
expect("predicted: tight target: TP2 is the cheapest per token", tight_cost["2 GPUs: TP2"]
       / tight_cost.drop("2 GPUs: TP2").min(), below=1)

# %% [markdown]
# ## How far to trust it
#
# Three layers, each checked against something measured:
#
# 1. **Kernels.** On the H100, H200 and A100 every GEMM, attention call, all-reduce and MoE
#    layer is vLLM's own kernel as AIConfigurator timed it: a GEMM of a measured shape is read
#    back exactly, others are interpolated between measured neighbours (`--vllm-version` picks the
#    measured version nearest yours). Attention is measured for uniform batches only, so a line in
#    the bytes and FLOPs it moves is fitted to those kernels, for decodes and for prompts apart:

# %%
for name, deployment in (("Llama-3-8B, TP1", llama8b), ("Llama-2-70B, TP4", Deployment("Llama-2-70B", "H100", 4)),
                         ("Mixtral-8x7B, TP2", Deployment("Mixtral-8x7B", "H100", 2,
                                                          args=EngineArgs(max_model_len=4096)))):
    fit = deployment.step_model.gpu.attention_fit
    print(f"{name}: attention of {fit.heads} heads ({fit.kv_heads} KV) per GPU, fitted to the kernels of "
          f"{fit.measured_heads['decode']} (decode) and {fit.measured_heads['prefill']} (prefill) heads: median "
          f"error {fit.median_error['decode']:.1%} and {fit.median_error['prefill']:.1%}")
    expect(f"check on the stored kernel tables: {name}: the attention fit is within 12% of its measured kernels at "
           "the median",
           max(fit.median_error.values()), below=0.12)

# %% [markdown]
#    Two sources of the same GEMMs, two years apart: Vidur's 2024 per-layer profiles of an older
#    vLLM on an H100 (`data/gpu_kernels/`), and AIConfigurator's of vLLM 0.24, for the four
#    projections of three models at every token count and TP degree the profiles hold:

# %%
for path in [KERNEL_PROFILES_DIR / "h100_Llama-2-7b-hf.csv", *sorted((KERNEL_PROFILES_DIR / "held_out").glob("*.csv"))]:
    gemms = compare_projections(read_kernel_profile(path), llama8b.step_model.gpu.tables.gemm_seconds)
    small, large = gemms[gemms["num_tokens"] <= 16], gemms[gemms["num_tokens"] >= 256]
    print(f"{path.stem}: AIConfigurator's time / the 2024 profile's, median: {1 + small['error'].median():.2f} "
          f"at 1-16 tokens, {1 + large['error'].median():.2f} at 256 tokens and more ({len(gemms)} GEMMs)")
    expect(f"check on two stored profiles: {path.stem}: at 1-16 tokens (reading the weights) the two sources agree "
           "within 10% at the median",
           small["error"].median(), above=-0.1, below=0.1)
    expect(f"check on two stored profiles: {path.stem}: at 256 tokens and more the newer GEMMs are faster at the median",
           large["error"].median(), below=0)

# %% [markdown]
#    Where a step reads weights, the two agree; where it computes, the newer kernels are faster,
#    which is one reason a prediction from the 2024 profiles ran slow.
#
#    On a GPU AIConfigurator did not measure (the L4 and T4 presets), the step falls back to a
#    kernel model fitted to 2024 per-layer profiles of an older vLLM (`data/gpu_kernels/`), and
#    every prediction says so in its `kernels:` line. That fallback, checked on two models the fit
#    never saw on the H100 (`data/gpu_kernels/held_out/`):

# %%
h100 = device_preset("H100").kernel_model()
for path in sorted((KERNEL_PROFILES_DIR / "held_out").glob("*.csv")):
    compared = compare_profile(read_kernel_profile(path), h100)
    median, worst = error_summary(compared)
    at = int(compared.loc[compared["error"].abs().idxmax(), "num_tokens"])
    print(f"{path.stem}: median error {median:.1%}, worst {worst:.1%} (at {at} tokens), {len(compared)} rows")
    expect(f"check on shipped data: {path.stem}: the fallback kernels are right to under 5% at the median", median,
           below=0.05)

# %% [markdown]
# 2. **The engine around the kernels**, as vLLM V1 runs it: decode steps padded to the batch
#    sizes vLLM captured CUDA graphs for; the CPU's scheduling work per step, which async
#    scheduling runs while the GPU computes the previous step (so a newcomer joins one step
#    later); each number with its source in `batchlab/vllm_sim/vllm_v1.json`.
# 3. **Whole deployments.** Checked against public measured runs of vLLM 0.15.1 on H100s
#    (constant-rate loads of 4-20 requests a second, ~600-token prompts sharing a system prompt,
#    ~250 output tokens, and a long-output set of ~1,000-token prompts and 1,448 output tokens; data
#    whose licence does not allow shipping it here, so it is not in this course; nothing was fitted
#    to it). Their client sent 100 fixed prompts in turn, so after the first hundred every prompt
#    was one vLLM had cached, and the check sends the same stream. With
#    `python scripts/check_predictor.py --inference-sim DIR` on a clone of it: the median error
#    over TTFT, TPOT and end-to-end median of the 20 stages the real servers kept up with is 3.8%,
#    and every one of the 24 saturation verdicts is right; one GPU, TP2 (CodeLlama-34B and
#    Mixtral-8x7B), TP4 (Llama-2-70B), from 5 to 20 requests a second: TPOT and end-to-end within
#    10%. The time to first token comes out 15-31% (6-15 ms) low on every stage: the API server's
#    own work for a request (HTTP, tokenizing, streaming) is not modelled. Errors grow near
#    capacity: a step predicted a little slow holds more sequences, which makes the next step
#    slower still. Check yours with runs you measured yourself:
#    `python scripts/check_predictor.py RUNS.jsonl`. NVIDIA's AIConfigurator, run on the same
#    stages (`--peers`), is 37.7% off at the median.

# %% [markdown]
# ## Explore
#
# Pick a model, a GPU, a TP degree and a number of replicas, and a load; one prediction runs per
# change (a second or two). On GPUs other than the H100, the memory CUDA reports is taken as the
# H100's share of its datasheet figure (0.99), which a card may not reach: read their KV caches
# as an upper bound (the deployment's description says so).

# %%
def show_deployment(model="Llama-3-8B", gpu="H100", tp=1, replicas=1, rate=20.0, input_len=800, output_len=250):
    try:
        deployment = Deployment(model, gpu, tp, replicas)
    except ValueError as err:
        print(err)
        return
    prediction = predict(deployment, TrafficSpec(int(rate * 20), rate, input_len=input_len,
                                                 output_len=output_len).generate())
    print("\n".join(deployment.describe() + [""] + prediction.summary_lines()))


explore(show_deployment, model=["Llama-3-8B", "Llama-2-7B", "CodeLlama-34B", "Llama-2-70B", "Mixtral-8x7B"],
        gpu=["H100", "H200", "A100", "L4"], tp=[1, 2, 4, 8], replicas=(1, 8), rate=(1.0, 100.0),
        input_len=(64, 4000), output_len=(16, 2000))

# %% [markdown]
# ## Summary
#
# - A deployment's memory is planned the way vLLM plans it: 90% of what CUDA reports, minus the
#   weights on each GPU, a profiling pass's peak and memory outside PyTorch; the rest is KV
#   blocks (within 1% of vLLM's own log for Llama-3-8B on an H100 with `--max-num-seqs 256`).
# - Tensor parallelism shortens every step, but not by the number of GPUs: each GPU still pays
#   fixed costs per kernel, and two all-reduces per layer take their share.
# - With two GPUs, TP2 streams faster at light and moderate load and carries more under a tight
#   latency target; two replicas carry more under a loose one. Per token, replicas cost what one
#   GPU does; TP2 is worth its second GPU only when the target is tight.
# - A mixture of experts reads most of its experts from a small batch on: its MLP's time per token
#   reaches a dense model's of the same active size only at a batch several times larger.
# - The kernels are vLLM's own, measured per GPU; whole deployments came within 3.8% of vLLM's
#   measured medians at the median over 20 load stages (one GPU, TP2, TP4, a mixture of experts),
#   every saturation verdict right; the time to first token 6-15 ms low, the API server's share.

# %% [markdown]
# ## Exercises
#
# Worked solutions are in `solutions/14_before_you_rent_the_gpus.py`.
#
# **14.1** How many KV blocks does each GPU of Llama-3-8B at TP2 on H100s hold with
# `--gpu-memory-utilization 0.8` and `--block-size 32` (everything else vLLM's defaults)? Answer
# with one integer.

# %%
answer = None  # your code here
check("14.1", answer)

# %% [markdown]
# **14.2** Your users need TPOT p90 under 15 ms and TTFT p90 under 500 ms, with the traffic of
# `chat_traffic` above. Among the three candidates, at the rates of `rates`, which one serves
# the most requests a second under that target, and what does a million output tokens cost on it
# at $3.00 per GPU-hour? Answer with `(name, dollars)`, the name as in `candidates`.

# %%
answer = None  # your code here: (name, dollars)
check("14.2", answer)
