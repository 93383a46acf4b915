# %% [markdown]
# # 16 · Prefill here, decode there: disaggregated serving
#
# Notebook 06 showed a newcomer's prompt stalling everyone's next token, and chunked prefill
# spreading that stall thin. Production systems have a second answer: run the two phases on
# different GPUs. *Prefill workers* compute each prompt's keys and values (its KV cache) and hand
# them to *decode workers*, which then run nothing but decode steps. This is *disaggregated
# serving*: DistServe and Splitwise studied it, Mooncake serves a chatbot with it, and vLLM runs it
# with its KV connectors behind `vllm-router`, llm-d and NVIDIA Dynamo.
#
# ## What you will learn
#
# - **How a request travels** from a prefill worker, over a link, to a decode worker, and what its
#   time to first token is made of then.
# - **The interference it removes**: the gaps between a stream's tokens, with and without prefills
#   in the same steps.
# - **What it costs**: moving the KV (bytes per token times the prompt, over which link), and GPUs
#   that only ever prefill.
# - **Where it pays**: the same GPUs colocated or split, for long and for short prompts, measured
#   by *goodput* (notebook 08): the highest request rate at which 90% of requests meet both a TTFT
#   and a TPOT bound.
# - **Why the ratio matters**: one prefill GPU for two decode GPUs is not two for one.
#
# Everything here is a prediction for GPUs, made by the course's simulator: Llama-3-8B on the
# H100 preset (its kernels fitted to times measured on real H100s, notebook 14), the engine of
# notebook 04 on every GPU, the routers of notebook 12 in front. Nothing here measures this CPU.

# %% [markdown]
# ## Setup

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

# %%
from batchlab.analysis.claims import expect
from batchlab.analysis.metrics import summary_row
from batchlab.analysis.widgets import explore
from batchlab.backends.roofline import model_shape
from batchlab.cluster import KV_LINKS, Cluster, ClusterConfig, DisaggregatedCluster, DisaggregatedConfig, ReplicaSpec
from batchlab.cluster.pd_goodput import attainment_table, goodput_by_layout
from batchlab.exercises import check
from batchlab.requests import Request
from batchlab.workloads import Range, make_workload

MODEL, GPU = "Llama-3-8B", "H100"

# %% [markdown]
# ## One request's trip
#
# The cluster has two *pools*, each behind its own router. A request goes first to a prefill
# worker, with its answer cut to one token (`max_tokens=1`, as `vllm-router` sends it): that
# worker computes the whole prompt. When its step ends, the prompt's KV crosses a link to a decode
# worker, which admits the request with that KV already in place (vLLM's KV connectors report
# such tokens as computed elsewhere), computes the last prompt token, samples the first token
# from it and decodes on. One request of 2,000 prompt tokens, alone, over InfiniBand:

# %%
split_1_1 = DisaggregatedCluster.for_device(MODEL, GPU, DisaggregatedConfig(num_prefill=1, num_decode=1))
trip = split_1_1.run([Request("trip", None, 8, arrival_time=0.0, prompt_len=2000)])
prefill_step = trip.prefill.traces[0].steps[0]
transfer = trip.transfers.iloc[0]
first_decode = trip.decode.traces[0].steps[0]
record = trip.merged.requests[0]
parts = {"prefill (2,000 tokens)": prefill_step.duration, "KV transfer": transfer["transfer_s"],
         "first decode step": first_decode.duration}
for name, seconds in parts.items():
    print(f"{name:24s} {seconds * 1e3:7.2f} ms")
ttft = record.token_times[0] - record.arrival_time
print(f"{'time to first token':24s} {ttft * 1e3:7.2f} ms")
expect("TTFT is the prefill, the transfer and one decode step, to the microsecond",
       abs(ttft - sum(parts.values())), below=1e-6)

# %% [markdown]
# ## The stall, gone
#
# Now a stream of long prompts (2,000-4,000 tokens, 128-384 tokens answered, 8 requests a second)
# on two GPUs, served two ways: two colocated replicas behind a router (each runs continuous
# batching with chunked prefill, as vLLM does), or one prefill GPU and one decode GPU. The
# picture is every gap between two tokens of a stream, sorted: the gaps a reader feels.

# %%
long_traffic = dict(prompt_len=Range(2000, 4000), output_len=Range(128, 384))
stream = make_workload(300, rate=8.0, seed=0, **long_traffic)
spec = ReplicaSpec.for_device(MODEL, GPU)
runs = {"2 colocated": Cluster(ClusterConfig(2, policy="least_outstanding"), spec).run(stream).merged,
        "1 prefill + 1 decode": split_1_1.run(stream).merged}
gaps = {name: np.concatenate([np.diff(r.token_times) for r in trace.requests]) * 1e3 for name, trace in runs.items()}
rows = {name: summary_row(trace) for name, trace in runs.items()}

# %%
fig, ax = plt.subplots(figsize=(7, 3))
for name, g in gaps.items():
    ax.plot(np.linspace(0, 100, len(g)), np.sort(g), label=name)
ax.set_xlabel("share of gaps (%)")
ax.set_ylabel("gap between tokens (ms)")
longest = {name: g.max() for name, g in gaps.items()}
ax.set_title(f"The longest gap: {longest['2 colocated']:.0f} ms colocated, "
             f"{longest['1 prefill + 1 decode']:.0f} ms split")
ax.legend()
plt.show()

# %% [markdown]
# Most gaps are one decode step either way (about 10 ms; the split's decode GPU runs fuller
# batches, so its steps are a little longer). The colocated tail is the steps a prompt shared:
# every stream on that GPU waited for a chunk of someone's prompt. On the decode GPU no step ever
# holds a prompt, and the tail is gone. The price is paid before the first token: one GPU
# prefills for both, and the KV must cross the link.

# %%
table = pd.DataFrame(rows).T[["ttft_p50", "ttft_p99", "itl_p50", "itl_p99"]] * 1e3
print(table.round(1).to_string())
expect("split, the 99th-percentile gap between tokens is under half the colocated one",
       rows["1 prefill + 1 decode"]["itl_p99"] / rows["2 colocated"]["itl_p99"], below=0.5)
expect("split, the median time to first token is longer",
       rows["1 prefill + 1 decode"]["ttft_p50"] / rows["2 colocated"]["ttft_p50"], above=1)

# %% [markdown]
# ## What the hand-off costs
#
# Every prompt token leaves keys and values in every layer: for Llama-3-8B, 32 layers x 8
# key/value heads x 128 numbers x 2 (keys and values) x 2 bytes, 128 KiB a token (notebook 05's
# formula). A 3,000-token prompt is 393 MB to move. How long that takes depends on the link
# between the two workers (nominal one-way bandwidths, plus an assumed 20 us per transfer):

# %%
kv_per_token = model_shape(MODEL).kv_bytes_per_token(2)
prompt_bytes = 3000 * kv_per_token
times_ms = pd.Series({name: link.transfer_time(prompt_bytes) * 1e3 for name, link in KV_LINKS.items()})
ax = times_ms.plot.barh(figsize=(7, 2.6), logx=True)
ax.set_xlabel("ms to move a 3,000-token prompt's KV")
ax.set_title(f"{prompt_bytes / 1e6:.0f} MB: {times_ms.min():.1f} ms over NVLink, "
             f"{times_ms.max():.0f} ms over 25 Gb/s Ethernet")
plt.show()
for name, link in KV_LINKS.items():
    print(f"{name:15s} {link.bandwidth / 1e9:6.1f} GB/s  ({link.source})")
expect("over NVLink the move takes under one decode step (10 ms)", times_ms["nvlink4"], below=10)
expect("over 25 Gb/s Ethernet it takes over ten decode steps", times_ms["ethernet-25g"], above=100)

# %% [markdown]
# A prefill worker sends one transfer at a time, so on a slow link they queue: the time to first
# token grows with the load long before the GPUs are busy. The same long prompts at 4 requests a
# second, over InfiniBand and over 25 Gb/s Ethernet:

# %%
moderate = make_workload(200, rate=4.0, seed=0, **long_traffic)
by_link = {}
for link in ("infiniband-ndr", "ethernet-25g"):
    cluster = DisaggregatedCluster.for_device(MODEL, GPU, DisaggregatedConfig(1, 1, link=link))
    by_link[link] = summary_row(cluster.run(moderate).merged)
    print(f"{link:15s} TTFT p50 {by_link[link]['ttft_p50'] * 1e3:5.0f} ms, "
          f"ITL p50 {by_link[link]['itl_p50'] * 1e3:4.1f} ms")
extra = by_link["ethernet-25g"]["ttft_p50"] - by_link["infiniband-ndr"]["ttft_p50"]
expect("25 Gb/s Ethernet adds at least 80 ms to the median TTFT (a 3,000-token move is 126 ms)",
       extra * 1e3, above=80)

# %% [markdown]
# ## Where it pays
#
# One number per layout, as DistServe measures it: sweep the request rate, count the requests
# that met both bounds, and read the highest rate at which 90% did (the *goodput*). Two GPUs,
# colocated or split, for two kinds of traffic:
#
# - long prompts (2,000-4,000 tokens) under a tight stream: TTFT at most 1 s, TPOT at most 12 ms;
# - short prompts (64-256 tokens) under a loose one: TTFT at most 0.5 s, TPOT at most 20 ms.
#
# Each point serves the same requests, moved in time; a sweep takes a few seconds.

# %%
sweeps = {
    "long prompts": attainment_table(MODEL, GPU, 2, [2, 3, 4, 5, 6, 7, 8], {"ttft": 1.0, "tpot": 0.012},
                                     num_requests=200, **long_traffic),
    "short prompts": attainment_table(MODEL, GPU, 2, [40, 60, 80, 100, 120, 140], {"ttft": 0.5, "tpot": 0.02},
                                      num_requests=600, prompt_len=Range(64, 256), output_len=Range(128, 384)),
}
best = {kind: goodput_by_layout(t, 2)["goodput"] for kind, t in sweeps.items()}
print(pd.DataFrame(best).round(1))

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
for ax, (kind, t) in zip(axes, sweeps.items()):
    for layout, rows_ in t.groupby("layout", sort=False):
        ax.plot(rows_["request_rate"], rows_["num_good"] / rows_["num_requests"], marker="o", label=layout)
    ax.axhline(0.9, color="grey", linestyle=":")
    ax.set_xlabel("requests per second")
    ax.set_title(kind)
axes[0].set_ylabel("share meeting the SLO")
axes[0].legend()
winner = {kind: b.fillna(0).idxmax() for kind, b in best.items()}
fig.suptitle(f"Long prompts: {winner['long prompts']} carries more; short prompts: {winner['short prompts']}",
             y=1.04)
plt.show()

# %% [markdown]
# With long prompts the split carries more at the same 90%: its decode steps never wait for a
# prompt, so TPOT holds to a higher rate. With short prompts there is little prefill to move out
# of the way, and the split wastes what it split: one decode GPU must carry every stream that two
# colocated GPUs shared, while the prefill GPU idles.

# %%
long_best, short_best = best["long prompts"], best["short prompts"].fillna(0.0)
expect("long prompts: the split's goodput is above 1.15x the colocated one",
       long_best["1P1D"] / long_best["colocated"], above=1.15)
expect("short prompts: the colocated goodput is above 1.5x the split's",
       short_best["colocated"] / max(short_best["1P1D"], 1e-9), above=1.5)

# %% [markdown]
# ## The ratio decides
#
# With three GPUs there are two splits. For the long-prompt traffic, which phase needs more GPUs?
# A prompt of 3,000 tokens takes under a tenth of a second of prefill, and its answer of 256
# tokens about 256 decode steps, each shared with the rest of a decode batch.

# %%
three = attainment_table(MODEL, GPU, 3, [2, 4, 6, 8, 10, 12], {"ttft": 1.0, "tpot": 0.012}, num_requests=300,
                         **long_traffic)
per_gpu = goodput_by_layout(three, 3)["goodput_per_gpu"]
ax = per_gpu.plot.bar(figsize=(5, 2.8), rot=0)
ax.set_ylabel("goodput per GPU (req/s)")
ax.set_title(f"Three GPUs: {per_gpu.idxmax()} carries the most per GPU")
plt.show()
expect("one prefill GPU and two decode GPUs beat two and one by over a third",
       per_gpu["1P2D"] / per_gpu["2P1D"], above=4 / 3)
expect("and beat three colocated GPUs", per_gpu["1P2D"] / per_gpu["colocated"], above=1)

# %% [markdown]
# The wrong ratio is worse than not splitting at all: with two prefill GPUs and one decode GPU,
# the decode GPU's batch is full and TPOT breaks first. Production systems size the two pools
# from the traffic's prompt and answer lengths, and move GPUs between them as the mix changes.
#
# **What the papers measured.** DistServe (OSDI 2024) reports up to 7.4x more goodput per GPU
# than vLLM on its workloads (chat, code completion and summarization with OPT-13B to 175B), and
# Splitwise (ISCA 2024) 1.4x the throughput at 20% lower cost. The figures above are the same
# shape under other conditions (another model, another GPU, this simulator's engine), not a
# reproduction of either.

# %% [markdown]
# ## Explore
#
# Prompt lengths, a TPOT bound and a link; one sweep of two GPUs runs per change (a few seconds).

# %%
def show_split(prompt_tokens=3000, tpot_ms=12, link="infiniband-ndr"):
    traffic = dict(prompt_len=Range(max(prompt_tokens // 2, 16), prompt_tokens), output_len=Range(128, 384))
    t = attainment_table(MODEL, GPU, 2, [1, 2, 4, 6, 8, 12, 16, 24, 32], {"ttft": 1.0, "tpot": tpot_ms / 1e3},
                         num_requests=200, link=link, **traffic)
    print(goodput_by_layout(t, 2).round(2).to_string())


explore(show_split, prompt_tokens=(128, 8000), tpot_ms=(8, 50), link=list(KV_LINKS))

# %% [markdown]
# ## Summary
#
# - Disaggregated serving computes prompts on prefill GPUs and streams tokens from decode GPUs;
#   the KV crosses a link between them, and the first token comes from the decode worker after
#   one decode step: TTFT = prefill + transfer + one step.
# - Decode steps never hold a prompt, so the long gaps a prefill adds to everyone's stream
#   disappear (the 99th-percentile gap fell from 52 ms to 15 ms here), paid for in time to
#   first token.
# - The KV is 128 KiB per token for Llama-3-8B: a few milliseconds over InfiniBand or NVLink, a
#   tenth of a second over 25 Gb/s Ethernet, and transfers queue on a slow link.
# - It pays where prefill interference is what breaks the SLO (long prompts, a tight TPOT bound)
#   and loses where prompts are short: the split wastes the GPUs it set aside for prefill.
# - The prefill:decode ratio matters as much as the split itself: the wrong one is worse than
#   colocation.

# %% [markdown]
# ## Exercises
#
# Worked solutions are in `solutions/16_prefill_here_decode_there.py`.
#
# **16.1** One request of 5,000 prompt tokens arrives alone at a 1P1D cluster of Llama-3-8B on
# H100s whose workers are joined by 100 Gb/s Ethernet (`"ethernet-100g"`). How many milliseconds
# after it arrives does its first token come? Answer with a number.

# %%
answer = None  # your code here
check("16.1", answer)

# %% [markdown]
# **16.2** You have four H100s for the long-prompt traffic above (`long_traffic`) under the same
# bounds (TTFT at most 1 s, TPOT at most 12 ms for 90% of requests). Sweep the rates 4, 6, ..., 18
# requests a second with 200 requests per point: which layout of `layouts(4)` (from
# `batchlab.cluster.pd_goodput`) has the highest goodput? Answer with its name, e.g. `"1P3D"`.

# %%
answer = None  # your code here
check("16.2", answer)
