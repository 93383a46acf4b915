# %% [markdown]
# # 01 · An idle device, and what a decode step costs
#
# The simplest server takes one request, answers it completely, then takes the next. This notebook
# measures what that leaves on the table. Two facts carry the rest of the course: such a server
# sits idle much of the time, and when it does work, it pays for reading the whole model to
# produce a single token, a cost that 8 requests could share almost for free.
#
# **What you will learn**
#
# - how to write a one-request-at-a-time server over the real model, on a *virtual clock*;
# - what share of the time its device is busy (`busy_share`), and why requests still queue while
#   the device is idle most of the time;
# - why a decode step costs what it costs: the bytes of weights it must read, the
#   memory-bandwidth floor, and arithmetic intensity (FLOPs per byte) at batch size *b*;
# - the measured step time against batch size, and the check that 8 sequences per step cost far
#   less per token than 1;
# - how queueing grows with traffic for a one-at-a-time server (a simulator explorer), and, in an
#   optional section you may skip, the queueing formula that predicts it (Pollaczek–Khinchine).

# %% [markdown]
# ## Setup
#
# The same cells run on a CPU and on a GPU; on a GPU they pick bigger sizes by themselves.

# %%
import math
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

# %%
# The course's package: the modules this notebook's sections use.
from batchlab.analysis import metrics
from batchlab.analysis.claims import expect, expect_true
from batchlab.analysis.device_profiles import load_device_profiles
from batchlab.analysis.plots import plot_occupancy, plot_step_profile, plot_timeline
from batchlab.analysis.widgets import explore
from batchlab.backends import ModelBackend
from batchlab.sim import SimBackend
from batchlab.experiments.calibration import calibrate_cost_model
from batchlab.steptime.device_presets import load_device_presets
from batchlab.steptime.kernel_profiles import (KERNEL_PROFILES_DIR, PROJECTION_COLUMNS, layer_shape_of,
                                              read_kernel_profile)
from batchlab.engine import Engine
from batchlab.exercises import check
from batchlab.model import load_model, profiler
from batchlab.model.environment import device_name, environment_report
from batchlab.model.llama import LlamaWeights, SeqChunk, forward_step
from batchlab.schedulers import StaticBatcher
from batchlab.workloads import Range, make_workload

# %%
# NBVAL_IGNORE_OUTPUT
lm = load_model()
weights = LlamaWeights.from_hf(lm.model)
ON_GPU = lm.device == "cuda"
DEVICE_NAME = device_name(lm.device)

# Sizes: small enough for 2 CPU cores, bigger on a GPU.
NUM_REQUESTS = 24 if ON_GPU else 8            # requests served on the real model
PROMPT_LEN, OUTPUT_LEN = Range(16, 64), 16    # tokens in, tokens out per request
BATCH_SIZES = [1, 2, 4, 8, 16] + ([32, 64, 128, 256] if ON_GPU else [])
TARGET_LOAD = 0.25                            # offered load: arrivals x service time (see below)
print(f"{DEVICE_NAME} ({lm.device}, {lm.dtype}); "
      f"load average {environment_report(lm.device).get('load_average_1min')}")

# %% [markdown]
# ## 1. One request at a time, by hand
#
# A request's life, as in notebook 00: one **prefill** step computes the whole prompt and yields
# the first token; then each **decode** step computes the newest token and yields the next.
# Requests here have no stop token: each produces exactly `max_new_tokens` tokens, as serving
# benchmarks do, so every run does the same work. We time each step.

# %%
def run_request(prompt_ids, max_new_tokens):
    """Serve one request alone: prefill, then greedy decode. Returns (token ids, seconds per step)."""
    cache = weights.new_kv_cache(num_slots=1, max_seq_len=len(prompt_ids) + max_new_tokens)
    chunk = SeqChunk(slot=0, start=0, token_ids=prompt_ids, want_logits=True)   # the prefill
    output_ids, step_seconds = [], []
    while len(output_ids) < max_new_tokens:
        t0 = time.perf_counter()
        logits = forward_step(weights, cache, [chunk])                           # (1, vocab)
        output_ids.append(int(logits[0].argmax()))        # int() waits for a GPU to finish
        step_seconds.append(time.perf_counter() - t0)
        position = len(prompt_ids) + len(output_ids) - 1                         # the newest token
        chunk = SeqChunk(0, position, [output_ids[-1]], True)                    # the next decode
    return output_ids, step_seconds

# %% [markdown]
# How long does one request occupy the device? We serve a typical one (40 prompt tokens,
# 16 output tokens) and call that the **service time** *S*.

# %%
# NBVAL_IGNORE_OUTPUT
trial = make_workload(1, prompt_len=40, output_len=OUTPUT_LEN, arrival="at_once",
                      tokenizer=lm.tokenizer, seed=100)[0]
run_request(trial.prompt_ids, 2)                              # warm-up: first calls are slower
_, trial_steps = run_request(trial.prompt_ids, trial.max_new_tokens)
SERVICE_S = sum(trial_steps)
print(f"prefill {trial_steps[0] * 1e3:.0f} ms, decode {np.median(trial_steps[1:]) * 1e3:.0f} ms "
      f"per token -> service time S = {SERVICE_S:.2f} s per request")

# %% [markdown]
# Now the traffic. Independent users send requests at random moments: a **Poisson process**, with
# exponential gaps between arrivals. Its rate sets the **offered load** ρ = rate × S, the share
# of time the device would need to serve everyone. We pick ρ = 0.25 from the measured *S*, so the
# experiment means the same thing on a slow CPU and on a fast GPU.
#
# The server runs on a **virtual clock**: time advances by each step's *measured* duration, and
# jumps over idle gaps straight to the next arrival. We get the timeline a real server would have,
# without sitting through the idle time. Each request's **queue time** (arrival to its first
# step) and **TTFT** (arrival to its first token) are the first two words of the
# [glossary in notebook 00](00_setup_and_tour.ipynb#glossary), which draws them on one request's timeline.

# %%
# NBVAL_IGNORE_OUTPUT
rate = TARGET_LOAD / SERVICE_S                                # requests per second
requests = make_workload(NUM_REQUESTS, prompt_len=PROMPT_LEN, output_len=OUTPUT_LEN,
                         arrival="poisson", rate=rate, seed=1, tokenizer=lm.tokenizer)
print(f"{len(requests)} requests at {rate:.3g} req/s; arrivals (s):",
      np.round([r.arrival_time for r in requests], 2))

# %%
def serve_one_at_a_time(requests):
    """First come, first served, one request at a time, on a virtual clock."""
    now, rows, outputs = 0.0, [], {}
    for req in requests:                                  # sorted by arrival time
        start = max(now, req.arrival_time)                # idle until it arrives (if not already here)
        output_ids, steps = run_request(req.prompt_ids, req.max_new_tokens)
        token_times = start + np.cumsum(steps)            # a token exists when its step ends
        now = float(token_times[-1])
        outputs[req.request_id] = output_ids
        rows.append({"request_id": req.request_id, "arrival": req.arrival_time, "start": start,
                     "first_token": token_times[0], "finish": now, "busy": sum(steps)})
    return pd.DataFrame(rows), outputs

# %%
# NBVAL_IGNORE_OUTPUT
by_hand, hand_outputs = serve_one_at_a_time(requests)
by_hand["queue_time"] = by_hand.start - by_hand.arrival       # waiting for the device
by_hand["ttft"] = by_hand.first_token - by_hand.arrival       # time to first token
hand_busy = by_hand.busy.sum() / (by_hand.finish.max() - by_hand.arrival.min())
print(f"device busy {hand_busy:.0%} of the time; requests that had to wait: "
      f"{(by_hand.queue_time > 0).sum()} of {len(by_hand)}")
by_hand[["request_id", "arrival", "queue_time", "ttft", "finish"]].round(2)

# %% [markdown]
# The device computed for only a small share of the time (around the offered load of 25 %, a bit
# more or less as the measured step times wobble). Yet some requests still waited, because random
# arrivals come in clumps: a request that arrives soon after another finds it still running.
# Idle time and waiting coexist, and neither is a bug in the code; it is how one-at-a-time
# serving behaves under random traffic.

# %%
assert hand_busy < 0.75, f"at offered load {TARGET_LOAD} the device should be idle much of the time; busy {hand_busy:.0%}"
assert (by_hand.queue_time > 0).any(), "with Poisson arrivals some requests should find the device busy"

# %% [markdown]
# ## 2. The same server with batchlab
#
# batchlab's `Engine` runs the same loop with the bookkeeping a real server needs (arrivals,
# queues, a trace of every step). A **static batcher with batch size 1** *is* a
# one-request-at-a-time server: a batch of one leaves the queue as soon as it is waiting and runs
# to its end before the next one starts. `ModelBackend` runs each step on the real model with the
# same `forward_step`; `max_num_seqs=1` gives it a KV cache with room for one sequence.

# %%
# NBVAL_IGNORE_OUTPUT
max_seq_len = max(r.max_total_tokens for r in requests)
one_at_a_time = Engine(StaticBatcher(batch_size=1, stream=True),
                       ModelBackend(lm, num_slots=1, max_seq_len=max_seq_len))
trace = one_at_a_time.run(requests, progress=True)
engine_busy = metrics.busy_share(trace)
print(f"busy share {engine_busy:.0%} (by hand: {hand_busy:.0%}); "
      f"sequences per step while busy: {metrics.mean_batch_occupancy(trace):.2f}")

# %%
engine_outputs = {r.request_id: r.output_ids for r in trace.requests}
assert engine_outputs == hand_outputs, "the engine runs the same greedy steps, so every token must match"
assert engine_busy < 0.75, f"the engine's server should be idle much of the time too; busy {engine_busy:.0%}"
assert metrics.mean_batch_occupancy(trace) == 1.0, "one at a time: every step serves exactly 1 sequence"

# %% [markdown]
# The timeline shows each request's life: a grey bar while it queues, orange for its prefill step,
# blue while it decodes. Below it, the occupancy: the number of sequences per step, which is 1
# while the device works and 0 in the gaps.

# %%
fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
plot_timeline(trace, ax=top, title=f"One request at a time on {DEVICE_NAME}")
plot_occupancy(trace, ax=bottom, title=f"Busy {engine_busy:.0%} of the time, and never more than 1 sequence per step")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 3. Why a decode step costs what it costs
#
# Look at the decode steps: each computes a single token, yet takes tens of milliseconds on a CPU.
# Computing a token means multiplying a vector by every weight matrix of the model, and that
# requires reading every weight from memory into the processor. On this model there are
# 135 million of them.

# %%
bytes_per_param = weights.embed.element_size()                 # 4 in fp32, 2 in bf16
weight_bytes = weights.num_bytes()                             # read once per step
matmul_params = weight_bytes // bytes_per_param                # parameters a token is multiplied by
pd.Series({"parameters used per token (M)": matmul_params / 1e6,
           "bytes per parameter": bytes_per_param,
           "weight bytes read per step (MB)": weight_bytes / 1e6}).round(1).to_frame("value")

# %% [markdown]
# ### The memory-bandwidth floor
#
# If a step must read `weight_bytes` and memory delivers `bandwidth` bytes per second, no step
# can take less than `weight_bytes / bandwidth`. We measure the bandwidth by summing a large
# tensor (bigger than any cache, so it must come from memory), and compare the floor with the
# decode steps the server just ran.

# %%
# NBVAL_IGNORE_OUTPUT
bandwidth = profiler.measure_bandwidth(device=weights.device)      # bytes per second
floor_ms = weight_bytes / bandwidth * 1e3
steps = trace.steps_df()
decode_ms = steps[steps.num_prefill_tokens == 0].duration.median() * 1e3
print(f"memory bandwidth {bandwidth / 1e9:.1f} GB/s -> floor {floor_ms:.1f} ms per step; "
      f"measured decode step {decode_ms:.1f} ms = {decode_ms / floor_ms:.1f} x the floor")

# %% [markdown]
# ### Arithmetic intensity: FLOPs per byte
#
# A step at batch size *b* computes *b* tokens. Each token costs about 2 FLOPs (one multiply, one
# add) per parameter, so the step does about **2 · params · b** FLOPs, while it reads the weights
# **once**, whatever *b* is. Its *arithmetic intensity* is
#
# $$ \text{intensity}(b) = \frac{2 \cdot \text{params} \cdot b}{\text{weight bytes}}
#    = \frac{2b}{\text{bytes per parameter}} \ \text{FLOPs per byte.} $$
#
# A device does at most `peak_flops` FLOPs per second and reads `bandwidth` bytes per second. Its
# *ridge point* `peak_flops / bandwidth` is the intensity at which both take equally long. Below
# it a step is **memory-bound**: its time is the floor, and adding sequences is nearly free. Above
# it, it is **compute-bound** and grows with *b*. This is the *roofline* model:
# `step time ≈ max(bytes / bandwidth, FLOPs / peak_flops)`. We measure `peak_flops` with one
# large matrix multiply.

# %%
# NBVAL_IGNORE_OUTPUT
def measure_matmul_flops(n, dtype, device, repeats=3):
    """Best FLOP/s of an (n x n) @ (n x n) matrix multiply: 2 n^3 FLOPs."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    best = math.inf
    for _ in range(repeats + 1):                          # the first run is a warm-up
        t0 = time.perf_counter()
        (a @ b).sum().item()                              # .item() waits for a GPU to finish
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best

peak_flops = measure_matmul_flops(4096 if ON_GPU else 1024, weights.dtype, weights.device)
ridge = peak_flops / bandwidth                            # FLOPs per byte where the roofs meet
crossover_batch = ridge * bytes_per_param / 2             # intensity(b) = ridge
print(f"peak {peak_flops / 1e9:.0f} GFLOP/s, ridge point {ridge:.0f} FLOPs/byte -> "
      f"decode turns compute-bound near batch {crossover_batch:.0f}")

# %% [markdown]
# On a data-centre GPU the ridge point is in the hundreds (an H100 does about 990 TFLOP/s in
# bf16 against 3.35 TB/s: about 300 FLOPs per byte, so by the weights alone batches of a few
# hundred would ride on the memory floor). That count leaves out the other read of a decode
# step: each sequence also reads its own KV cache, every cached key and value of every layer.
# For this model that is 2 × 30 layers × 3 KV heads × 64 × 4 bytes = 46 KB per cached token in
# fp32, so a step whose sequences hold about 11,700 cached tokens between them (12 sequences of
# 1,000 tokens) reads as much KV as weights; for an 8-billion-parameter Llama in bf16 it is
# 128 KB per token against 16 GB of weights, and 256 sequences of 2,000 tokens read four times
# the weights. That read grows with every sequence and every token of context and is not shared,
# so long-context batches leave the floor far earlier than the roofline of the weights says. On a small CPU it is much lower (printed above): it multiplies slowly compared
# with how fast it reads memory, so by the roofline decode leaves the memory floor after a few
# tens of sequences at most. Real steps turn up sooner still, because the peak is what one large
# square multiply reaches, and a multiply with only *b* rows runs at a fraction of it (the
# measurement below shows how much). The lesson "8 cost about as much as 1" is a GPU's; on this
# CPU we expect "8 cost much less *per token* than 1", which is the part that matters for serving.

# %%
# NBVAL_IGNORE_OUTPUT
roofline = pd.DataFrame({"batch_size": BATCH_SIZES})
roofline["intensity"] = 2 * matmul_params * roofline.batch_size / weight_bytes   # FLOPs per byte
roofline["memory_ms"] = weight_bytes / bandwidth * 1e3
roofline["compute_ms"] = 2 * matmul_params * roofline.batch_size / peak_flops * 1e3
roofline["roofline_ms"] = roofline[["memory_ms", "compute_ms"]].max(axis=1)
roofline["bound_by"] = np.where(roofline.intensity < ridge, "memory", "compute")
roofline.round(2)

# %% [markdown]
# ### The roofline on real GPUs, measured
#
# The roofline is a bound: no kernel beats it. How close do real ones come? The course ships
# public measurements of GPU kernels (`data/gpu_kernels/`: Vidur's profiles, MIT License): one
# decoder layer's operators on an A100 and an H100, in bf16, for 1 to 4,096 tokens per step.
# Below, the four matrix multiplies of one layer (q, k, v; o; the MLP's gate and up; down), as
# measured, against the datasheet's roofline `max(weight bytes / bandwidth, FLOPs / peak)`. In
# bf16 a token does 2 FLOPs per 2-byte weight, so *t* tokens have an intensity of *t* FLOPs per
# byte and the ridge sits at `peak / bandwidth` tokens. The third line is the course's
# **grounded preset** for that GPU (`batchlab/steptime/device_presets.json`): each kernel
# reaches the fractions of the datasheet's bandwidth and peak fitted to these measurements, with
# a fixed cost per kernel and a smooth turn between the two roofs (`scripts/fit_gpu_presets.py`).
# The simulator's GPU cost model in later notebooks is built from it.

# %%
gpu_presets = load_device_presets()


def layer_against_roofline(file_name, device):
    """One layer's four matrix multiplies on one GPU: measured, the datasheet roofline, the preset."""
    table = read_kernel_profile(KERNEL_PROFILES_DIR / file_name)
    table = table[table.tensor_parallel == 1]
    layer, preset = layer_shape_of(table), gpu_presets[device]
    tokens = table.num_tokens.to_numpy(dtype=float)
    memory_s = layer.matmul_params * preset.dtype_bytes / preset.memory_bandwidth_Bps
    compute_s = 2 * layer.matmul_params * tokens / preset.peak_flops
    return pd.DataFrame({"tokens": tokens,
                         "measured_ms": table[list(PROJECTION_COLUMNS)].sum(axis=1).to_numpy(),
                         "roofline_ms": np.maximum(memory_s, compute_s) * 1e3,
                         "preset_ms": preset.kernel_model().projections_seconds(layer, tokens) * 1e3})


gpu_layers = {("A100", "Llama-3-8B"): layer_against_roofline("a100_Meta-Llama-3-8B.csv", "A100"),
              ("H100", "Llama-2-7B"): layer_against_roofline("h100_Llama-2-7b-hf.csv", "H100")}

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
for ax, ((device, model), g) in zip(axes, gpu_layers.items()):
    ax.plot(g.tokens, g.roofline_ms, ":", color="grey", label="datasheet roofline")
    ax.plot(g.tokens, g.measured_ms, ".", ms=4, label="measured (Vidur)")
    ax.plot(g.tokens, g.preset_ms, "-", lw=1.5, label="grounded preset")
    ax.axvline(gpu_presets[device].peak_flops / gpu_presets[device].memory_bandwidth_Bps, color="k", lw=0.5)
    ax.set(xscale="log", yscale="log", xlabel="tokens per step (ridge: vertical line)",
           title=f"{device}: one {model} layer's matrix multiplies")
    ax.set_xscale("log", base=2)
axes[0].set_ylabel("ms per layer")
axes[0].legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# Checked on both GPUs: every measured point sits above the roofline, by 20-45% at one token
# (decode at batch 1: the kernels read the weights at 80-90% of the datasheet's bandwidth and pay
# a few microseconds per kernel); the gap is widest near the ridge, where
# neither roof binds alone and the real kernels turn slowly from one to the other. The grounded
# preset follows the measured points to within a quarter everywhere, and to within a tenth at
# the median.

# %%
for (device, model), g in gpu_layers.items():
    ridge_tokens = gpu_presets[device].peak_flops / gpu_presets[device].memory_bandwidth_Bps
    over = g.measured_ms / g.roofline_ms
    widest = g.tokens[over.idxmax()]
    preset_error = (g.preset_ms / g.measured_ms - 1).abs()
    print(f"{device}: measured / roofline x{over.iloc[0]:.2f} at 1 token, widest x{over.max():.2f} at "
          f"{widest:.0f} tokens (ridge {ridge_tokens:.0f}); preset error median {preset_error.median():.1%}, "
          f"worst {preset_error.max():.1%}")
    expect(f"{device}: measured / datasheet roofline, every token count", over, above=1.0)
    expect(f"{device}: measured / datasheet roofline at 1 token", over.iloc[0], above=1.2, below=1.45)
    expect_true(f"{device}: the widest gap lies within a factor 2 of the ridge",
                ridge_tokens / 2 <= widest <= 2 * ridge_tokens, widest)
    expect(f"{device}: grounded preset's median error", preset_error.median(), below=0.10)
    expect(f"{device}: grounded preset's worst error", preset_error.max(), below=0.25)
    expect(f"{device}: the preset's kernels' share of datasheet bandwidth",
           gpu_presets[device].kernels.bandwidth_fraction, above=0.8, below=0.9)

# %% [markdown]
# ## 4. Measured: step time against batch size
#
# `profiler.profile_steps` times real decode steps of the model: *b* sequences, each decoding one
# token at position 64, for each batch size. A busy machine makes single measurements noisy, so
# we profile three times and keep each batch size's fastest run: interruptions only ever make a
# step slower, so the fastest is the best estimate of what the hardware needs.

# %%
# NBVAL_IGNORE_OUTPUT
rounds = [profiler.profile_steps(weights, batch_sizes=BATCH_SIZES, context_len=64,
                                 prefill_sizes=(), repeats=3, bandwidth=bandwidth,
                                 progress=(i == 0))
          for i in range(3)]
profile = (pd.concat(rounds).sort_values("ms_per_step").groupby("batch_size").head(1)
           .sort_values("batch_size").reset_index(drop=True))
profile[["batch_size", "ms_per_step", "ms_per_token", "tokens_per_s", "x_floor"]].round(2)

# %%
ax = plot_step_profile(profile, bandwidth_floor_ms="floor_ms",
                       title=f"Decode step time vs batch size on {DEVICE_NAME}")
ax.plot(roofline.batch_size, roofline.roofline_ms, ":", color="grey", label="roofline prediction")
ax.set_xscale("log", base=2)
ax.set_xticks(BATCH_SIZES, [str(b) for b in BATCH_SIZES])
handles, labels = ax.get_legend_handles_labels()
h2, l2 = ax.right_ax.get_legend_handles_labels()
ax.legend(handles + h2, labels + l2, fontsize=8, loc="upper left")
plt.show()

# %% [markdown]
# The claim, checked. Per token, a step for 8 sequences must cost well under half of a step for 1
# (on a GPU it is close to 1/8). And no measured step may beat the bandwidth floor by much: the
# floor is physics, so a step far below it would mean a measuring mistake.

# %%
# NBVAL_IGNORE_OUTPUT
per_token = profile.set_index("batch_size").ms_per_token
per_step = profile.set_index("batch_size").ms_per_step
print(f"batch 8 vs batch 1: step {per_step[8] / per_step[1]:.2f} x as long, "
      f"{per_token[8] / per_token[1]:.2f} x the time per token")
assert per_token[8] < 0.5 * per_token[1], (
    f"8 sequences per step should cost far less per token than 1: {per_token[8]:.1f} ms vs {per_token[1]:.1f} ms")
assert (profile.x_floor > 0.5).all(), f"a step beat the bandwidth floor by 2x:\n{profile[['batch_size', 'x_floor']]}"

# %% [markdown]
# ### Beside other devices
#
# The curve above is this machine's. `scripts/profile_device.py` measures the same profile on
# any device and stores it in `data/device_profiles/` (on a GPU, `scripts/gpu_check.sh` runs it),
# so here every stored profile is drawn next to the live one, each labelled with the device and
# dtype it was measured on. Time per token is the axis that compares devices of any speed: the
# lesson holds where the line falls as the batch grows.

# %%
stored = load_device_profiles()
fig, ax = plt.subplots(figsize=(8, 4))
ax.plot(profile.batch_size, profile.ms_per_token, "o-", lw=2, label=f"{DEVICE_NAME} ({lm.dtype}, live)")
for p in stored:
    ax.plot(p.decode.batch_size, p.decode.ms_per_token, "s--", label=p.label)
ax.set(xscale="log", yscale="log", xlabel="sequences per decode step", ylabel="ms per token",
       title="On every device measured, a fuller decode step makes each token cheaper")
ax.set_xscale("log", base=2)
ax.legend(fontsize=8)
plt.show()
for p in stored:          # the lesson, on each stored device: batch 8 costs far less per token
    per_tok = p.decode.set_index("batch_size").ms_per_token
    assert per_tok[8] < 0.5 * per_tok[1], (p.label, per_tok)
print(f"{len(stored)} stored profile(s): " + (", ".join(p.label for p in stored) or "none yet"))

# %% [markdown]
# Where the measured line sits well above the roofline, the gap is work the roofline does not
# count. On a CPU: matrix multiplies with only *b* rows run far below the peak of a large square
# one, and attention and the small element-wise operations add time of their own. On a GPU with
# a model this small: mostly the fixed cost of launching a few hundred small kernels per step.
# Either way the step grows far more slowly than the number of sequences in it, so every added
# sequence makes each token cheaper.
#
# A one-at-a-time server runs every step at batch 1, the most expensive point per token on the
# curve. Whatever its busy share, it pays a full weight read for every token it produces.

# %% [markdown]
# ## 5. Explorer: traffic against a one-at-a-time server
#
# A few requests on the real model show the idea; to see how a server behaves over thousands of
# requests and many traffic levels we use the **simulator**: `calibrate_cost_model` times a varied
# set of real steps on this machine (10-20 s on a CPU) and fits a step-time formula to them;
# `SimBackend` then predicts step durations from that formula instead of computing them. The fit
# is stored for this machine and setup: later notebooks pass `reuse=True`, which times about 30
# fresh steps (a few seconds) and takes the stored fit only if it predicts them within 10%.
#
# The formula has four terms: a fixed cost per step, a cost per sequence in the step, a cost per
# token computed, and a cost per **attention pair**. An attention pair is one (query token, key
# token) pair the attention scores: a token at position *p* attends to itself and the *p* tokens
# before it, so a decode at position *p* is *p* + 1 pairs (it reads *p* + 1 cached keys), and a
# prompt of *n* tokens is *n*(*n* + 1)/2 pairs (the causal triangle). Pairs are what make long
# contexts slow; `batchlab.steptime.cost_model` writes the formula out.

# %%
# NBVAL_IGNORE_OUTPUT
cost = calibrate_cost_model(ModelBackend(lm, num_slots=16, max_seq_len=512), progress=True)
print(cost)

# %%
SIM_REQUESTS = 2000                               # simulated requests per run (a fraction of a second)
SIM_SCALE = "full" if ON_GPU else "cpu"           # chat lengths: shrunk for a CPU's cost model

def simulate_one_at_a_time(rate, num_requests=SIM_REQUESTS, seed=2):
    """Serve `num_requests` chat requests arriving at `rate` req/s, one at a time, on the simulator."""
    reqs = make_workload(num_requests, "chat", scale=SIM_SCALE, arrival="poisson", rate=rate, seed=seed)
    backend = SimBackend(cost, kv_capacity_tokens=max(r.max_total_tokens for r in reqs))
    return Engine(StaticBatcher(batch_size=1, stream=True), backend).run(reqs)

# %% [markdown]
# With a seeded workload the requests stay the same whatever the rate; only their arrival times
# move. So the mean service time *S* is a property of the workload, and the server's capacity is
# 1 / *S* requests per second. We sweep the offered load ρ = rate × *S* from 0.1 to 0.95.

# %%
# NBVAL_IGNORE_OUTPUT
quiet = metrics.per_request_metrics(simulate_one_at_a_time(rate=1e-3))
service = quiet.e2e - quiet.queue_time                     # time on the device, per request
SIM_S, SIM_CV2 = service.mean(), service.var(ddof=0) / service.mean() ** 2
capacity = 1 / SIM_S
rows = []
for load in [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]:
    tr = simulate_one_at_a_time(rate=load * capacity)
    pm = metrics.per_request_metrics(tr)
    rows.append({"load": load, "request_rate": load * capacity, "busy_share": metrics.busy_share(tr),
                 "mean_wait": pm.queue_time.mean(), "ttft_p90": pm.ttft.quantile(0.9)})
sweep = pd.DataFrame(rows)
print(f"mean service time S = {SIM_S:.2f} s (CV² = {SIM_CV2:.2f}): capacity {capacity:.2f} req/s")
sweep.round(3)

# %% [markdown]
# The **utilization law** describes the first column: the busy share equals the offered load,
# rate × *S*, as long as it is below 1. A server at 30 % load is idle 70 % of the time. Yet its
# requests wait, because random arrivals clump, and the wait explodes as the load approaches 1:
# the last few percent of utilisation are paid for in waiting. Checked on the sweep:

# %%
at = sweep.set_index("load")
expect("busy share - offered load, loads up to 0.8", at.busy_share.loc[:0.8] - at.index[at.index <= 0.8],
       above=-0.1, below=0.1)
expect("mean wait at load 0.9 / at load 0.3", at.mean_wait[0.9] / at.mean_wait[0.3], above=5.0)

# %% [markdown]
# Move the arrival rate. Left: the first 30 requests of the simulated run (grey = waiting).
# Right: busy share and mean wait over the whole sweep, with the chosen rate marked. Watch the
# device sit idle at low rates while some requests still wait, and the wait take off near
# capacity although the device never computes more than one sequence at a time. The right panel
# is its own function, so the explorer's function stays short:

# %%
def plot_sweep(ax, rate):
    """Busy share (left axis) and mean wait (right axis) of the sweep, with `rate` marked."""
    ax.plot(sweep.request_rate, sweep.busy_share, "o-", label="busy share (left axis)")
    ax.set(ylim=(0, 1.05), xlabel="request rate (req/s)", ylabel="device busy share",
           title="One at a time: idle device, growing queue")
    waits = ax.twinx()
    waits.plot(sweep.request_rate, sweep.mean_wait, "s-", color="tab:red", label="mean wait (right axis)")
    waits.set_ylabel("mean wait in queue (s)")
    ax.axvline(rate, color="black", linestyle="--", linewidth=0.8)
    ax.legend(handles=ax.get_lines()[:1] + waits.get_lines(), fontsize=8, loc="upper left")

# %%
def show_one_at_a_time(rate=0.5 * capacity):
    """Timeline of a one-at-a-time server at `rate` req/s, next to the whole sweep."""
    tr = simulate_one_at_a_time(rate)
    busy, wait = metrics.busy_share(tr), metrics.per_request_metrics(tr).queue_time.mean()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    plot_timeline(tr, ax=left, max_requests=30,
                  title=f"{rate:.3g} req/s (load {rate / capacity:.0%}): busy {busy:.0%}, mean wait {wait:.1f} s")
    left.get_legend().remove()
    shown = tr.requests_df().nsmallest(30, "arrival_time")
    left.set_xlim(0, shown.release_time.max() * 1.02)         # just the 30 requests drawn
    plot_sweep(right, rate)
    fig.tight_layout()
    return fig

explore(show_one_at_a_time, rate=(round(0.05 * capacity, 3), round(0.98 * capacity, 3)))

# %%
fig = show_one_at_a_time(rate=0.5 * capacity)
plt.show()

# %% [markdown]
# ### Optional: how long the queue gets (Pollaczek–Khinchine)
#
# > **Optional box.** This section puts a formula on the growing wait. Skip it if you like:
# > nothing later in the course depends on it (only exercise 01.4 uses the formula, and it is
# > stated there again).
#
# For one server with Poisson arrivals and any service-time distribution, the
# **Pollaczek–Khinchine formula** gives the mean wait in the queue:
# $W_q = \dfrac{\rho \, S \, (1 + CV^2)}{2 (1 - \rho)}$, where ρ is the offered load and $CV^2$
# the squared coefficient of variation of the service time. The `1 / (1 - ρ)` is the explosion
# near capacity; the `1 + CV^2` says that variable service times (short and long answers mixed)
# make the queue longer at the same load.
#
# The simulated waits should follow it at moderate load. (Near full load a finite run has not
# yet reached its long-run average, so there the simulated waits fall below the formula; they
# would keep growing with more requests.)

# %%
# NBVAL_IGNORE_OUTPUT
sweep["pk_wait"] = sweep.load * SIM_S * (1 + SIM_CV2) / (2 * (1 - sweep.load))
pk_ratio = sweep.set_index("load").eval("mean_wait / pk_wait")
expect("simulated mean wait / Pollaczek-Khinchine, loads 0.5 and 0.7", pk_ratio[[0.5, 0.7]],
       above=0.67, below=1.5)
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(sweep.load, sweep.mean_wait, "s-", color="tab:red", label="simulated")
ax.plot(sweep.load, sweep.pk_wait, ":", color="black", label="Pollaczek-Khinchine")
ax.set(xlabel="offered load ρ", ylabel="mean wait in queue (s)", title="The formula predicts the queue")
ax.legend()
plt.show()

# %% [markdown]
# ## Summary
#
# - A server that answers one request at a time leaves the device idle whenever the traffic is
#   below its capacity (busy share = offered load), and its requests still queue because random
#   arrivals clump; the wait grows without bound as the load approaches capacity.
# - A decode step must read every weight once. That gives a floor, `weight bytes / bandwidth`,
#   that no step can beat, and it is paid per step, not per sequence.
# - Arithmetic intensity at batch *b* is about 2·params·*b* / weight bytes FLOPs per byte. Below
#   the device's ridge point (`peak FLOP/s / bandwidth`) extra sequences ride on the same weight
#   read almost for free; a GPU's ridge point is in the hundreds, a small CPU's is much lower.
#   Each sequence still reads its own KV cache, which is not shared: with long contexts that
#   read, not the arithmetic, ends the free ride.
# - Measured on this machine: per token, a step for 8 sequences costs a fraction of a step for 1.
#   A one-at-a-time server always runs at batch 1, the dearest point on the curve. The rest of
#   the course is about batching: how to put more sequences into each step without making anyone
#   wait too long.

# %% [markdown]
# ## Exercises
#
# **01.1 · The bandwidth floor.** A 7-billion-parameter model is served in bfloat16 (2 bytes per
# parameter) on a GPU whose memory delivers 3.35 TB/s (an H100 SXM). Ignoring the KV cache, what
# is the shortest possible decode step, in milliseconds? Put the number in `answer`.

# %%
answer = None  # your code here
check("01.1", answer)

# %% [markdown]
# **01.2 · Where decode turns compute-bound.** The same GPU does about 989 TFLOP/s of dense
# bfloat16 matrix maths. At what batch size *b* does a decode step of the 7B model reach the
# GPU's ridge point? (Use 2 FLOPs per parameter per token and the weights read once per step.)

# %%
answer = None  # your code here
check("01.2", answer)

# %% [markdown]
# **01.3 · Predict the per-token cost from a profile.** Write a function
# `per_token_ms(profile, b)` that, given a profile table with columns `batch_size` and
# `ms_per_step` (like `profile` above), predicts the milliseconds per token of a decode step at
# batch size `b` (any whole number between the smallest and largest measured size): interpolate
# the step time linearly between the two nearest measured batch sizes (`np.interp`), then divide
# by the number of tokens the step produces. Put the function itself in `answer`, and try it on
# `profile` for a batch size you did not measure.

# %%
answer = None  # your code here
check("01.3", answer)

# %% [markdown]
# **01.4 · Idle, yet waiting.** A one-at-a-time server needs on average S = 1.2 s per request,
# with service times whose squared coefficient of variation is CV² = 0.5. Requests arrive as a
# Poisson process at 0.5 per second. Give `answer = (busy_share, mean_wait_s)`: the share of time
# the device is busy and the mean time a request waits in the queue (Pollaczek–Khinchine, from the
# optional section: $W_q = \rho S (1 + CV^2) / (2 (1 - \rho))$ with $\rho$ = rate × S).

# %%
answer = None  # your code here
check("01.4", answer)
