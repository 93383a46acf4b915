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
# - **The protocol, for real**: two of the course's servers playing prefill and decode worker
#   behind `vllm-router`, the KV moving between two processes on this machine.
#
# Until the last section everything here is a prediction for GPUs, made by the course's
# simulator: Llama-3-8B served as `vllm serve` serves it on H100s, every GPU with notebook 14's
# step model (measured vLLM kernels), vLLM's KV cache, async scheduling and its default budgets
# for an H100 (1,024 sequences and 8,192 tokens a step, chunked prefill), the routers of notebook
# 12 in front. The last section runs the hand-off for real, on this CPU, with the course's own
# model.

# %% [markdown]
# ## Setup

# %%
import time

import httpx
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

# %%
from batchlab.analysis.claims import expect, expect_close, expect_true
from batchlab.analysis.metrics import summary_row
from batchlab.analysis.widgets import explore
from batchlab.steptime.roofline import model_shape
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
# worker computes the whole prompt. When its step ends, the request goes to a decode worker, which
# takes KV blocks for the prompt and pulls the prompt's KV into them across a link (vLLM's KV
# connectors report such tokens as computed elsewhere). At its first step after the KV has
# landed it computes the last prompt token, samples the first token from it and decodes on. One
# request of 2,000 prompt tokens, alone, over InfiniBand:

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
expect_close("by construction (the simulator's bookkeeping): TTFT = prefill + transfer + one decode step",
             ttft, sum(parts.values()), rel_tol=1e-9)

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
# Most gaps are one decode step either way (the medians, `itl_p50`, in the table below; the
# split's decode GPU runs fuller batches, so its steps are a little longer). The colocated tail is the steps a prompt shared:
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
# Colocation has its own answer to the same stall (notebook 06): a smaller token budget, so each
# prompt is cut into smaller chunks and a step that carries one is shorter (Sarathi-Serve's
# point). The same two colocated replicas with budgets of 512, 2,048 and vLLM's H100 default of
# 8,192 tokens a step, beside the split:

# %%
budgets = {}
for budget in (512, 2048, 8192):
    replicas = ReplicaSpec.for_device(MODEL, GPU, max_num_batched_tokens=budget)
    budgets[f"colocated, {budget} tokens"] = summary_row(
        Cluster(ClusterConfig(2, policy="least_outstanding"), replicas).run(stream).merged)
budgets["1 prefill + 1 decode"] = rows["1 prefill + 1 decode"]
by_budget = pd.DataFrame(budgets).T[["ttft_p50", "ttft_p99", "itl_p50", "itl_p99"]] * 1e3
print(by_budget.round(1).to_string())
small, default = by_budget.loc["colocated, 512 tokens"], by_budget.loc["colocated, 8192 tokens"]
expect("colocated: the 99th-percentile gap with a 512-token budget / with 8,192", small["itl_p99"] / default["itl_p99"],
       below=0.5)
expect("colocated: the median TTFT with a 512-token budget / with 8,192", small["ttft_p50"] / default["ttft_p50"],
       above=1)
expect("the split's 99th-percentile gap / the 512-token colocated one",
       by_budget.loc["1 prefill + 1 decode", "itl_p99"] / small["itl_p99"], below=1)

# %% [markdown]
# Smaller chunks remove most of the colocated tail on the same two GPUs, paid for with a longer
# time to first token (a prompt now takes several steps); the split removes the rest. So how
# much a split gains depends on the colocated deployment it is compared with: against one tuned
# for short gaps, less than against vLLM's default budget, and less again than against an engine
# with no chunked prefill at all.

# %% [markdown]
# ## What the hand-off costs
#
# Every prompt token leaves keys and values in every layer: for Llama-3-8B, 32 layers x 8
# key/value heads x 128 numbers x 2 (keys and values) x 2 bytes, 128 KiB a token (notebook 05's
# formula). A 3,000-token prompt is 393 MB to move. How long that takes depends on the link
# between the two workers (nominal one-way bandwidths, plus an assumed 20 us per transfer): this
# is arithmetic on the links' datasheets, set here against the decode step of the trip above.

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
decode_ms = first_decode.duration * 1e3
print(f"one decode step of the trip above: {decode_ms:.1f} ms")
expect("arithmetic: over NVLink the move takes under one decode step", times_ms["nvlink4"] / decode_ms, below=1)
expect("arithmetic: over 25 Gb/s Ethernet it takes over ten decode steps", times_ms["ethernet-25g"] / decode_ms,
       above=10)

# %% [markdown]
# The simulator assumes a prefill worker sends one transfer at a time, so on a slow link they
# queue: the time to first token grows with the load long before the GPUs are busy. (vLLM's
# decode workers pull the KV with NIXL, and several reads can be in flight at once: they share the
# link's bandwidth and slow each other down instead of waiting in line.) And the decode worker
# holds the blocks
# of every prompt whose KV is still on its way: memory that serves nobody yet. The same long
# prompts at 4 requests a second, over InfiniBand and over 25 Gb/s Ethernet:

# %%
moderate = make_workload(200, rate=4.0, seed=0, **long_traffic)
by_link, in_flight_gb, queued = {}, {}, {}
for link in ("infiniband-ndr", "ethernet-25g"):
    cluster = DisaggregatedCluster.for_device(MODEL, GPU, DisaggregatedConfig(1, 1, link=link))
    result = cluster.run(moderate)
    by_link[link] = summary_row(result.merged)
    sent = result.transfers
    held_s = sent["kv_arrived"] - sent["prefill_end"]        # the prompt is computed, its KV not there yet
    in_flight_gb[link] = (sent["kv_bytes"] * held_s).sum() / sent["kv_arrived"].max() / 1e9   # a time average
    queued[link] = held_s.median() / sent["transfer_s"].median()
    print(f"{link:15s} TTFT p50 {by_link[link]['ttft_p50'] * 1e3:5.0f} ms, "
          f"ITL p50 {by_link[link]['itl_p50'] * 1e3:4.1f} ms, KV in flight {in_flight_gb[link]:.2f} GB on average, "
          f"median wait for the KV / median move {queued[link]:.2f}")
extra = by_link["ethernet-25g"]["ttft_p50"] - by_link["infiniband-ndr"]["ttft_p50"]
print(f"25 Gb/s Ethernet adds {extra * 1e3:.0f} ms to the median TTFT")
# The link is busy about half the time at 4 requests/s (126 ms moves, 4 a second): a queue's
# median wait is then a sizeable share of a move.
expect("on 25 Gb/s Ethernet the transfers queue: the median wait for the KV / the median move itself",
       queued["ethernet-25g"], above=1.1)
expect("follows from the bandwidths (16x) and the queue: the KV in flight, Ethernet / InfiniBand",
       in_flight_gb["ethernet-25g"] / in_flight_gb["infiniband-ndr"], above=10)

# %% [markdown]
# ## Where it pays
#
# One number per layout, as DistServe measures it: sweep the request rate, count the requests
# that met both bounds, and read the highest rate at which 90% did (the *goodput*). Two GPUs,
# colocated or split, for two kinds of traffic:
#
# - long prompts (2,000-4,000 tokens): TTFT at most 1 s, TPOT at most 12 ms;
# - short prompts (64-256 tokens): TTFT at most 0.5 s, TPOT at most 15 ms.
#
# Each point serves the same requests, moved in time; a sweep takes a few seconds.

# %%
sweeps = {
    "long prompts": attainment_table(MODEL, GPU, 2, [2, 4, 6, 8, 10, 12, 14, 16], {"ttft": 1.0, "tpot": 0.012},
                                     num_requests=200, **long_traffic),
    "short prompts": attainment_table(MODEL, GPU, 2, [60, 120, 180, 240, 300, 400], {"ttft": 0.5, "tpot": 0.015},
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
long_best, short_best = best["long prompts"], best["short prompts"]
expect_true("every goodput was found inside its sweep (none infinite, none missing)",
            bool(np.isfinite(pd.concat([long_best, short_best])).all()))
expect("long prompts: the split's goodput / the colocated one", long_best["1P1D"] / long_best["colocated"], above=1.5)
expect("short prompts: the colocated goodput / the split's", short_best["colocated"] / short_best["1P1D"], above=1.5)

# %% [markdown]
# ## The ratio decides
#
# With three GPUs there are two splits. For the long-prompt traffic, which phase needs more GPUs?
# A back-of-envelope first, from one H100's step time (the replicas' own step model). A prefill
# GPU spends one step on an average prompt (3,000 tokens), so it prefills one over that many
# prompts a second. A decode GPU keeps TPOT under 12 ms only while a decode step over its batch
# stays under 12 ms: that caps its seats, and each request holds a seat for its answer's 256
# steps, at an average context of 3,000 + 128 tokens.

# %%
step = spec.vllm.step_model
prefill_per_s = 1 / step.predict_features(1, 3000, 3000 * 3001 // 2)
context, tpot_bound = 3000 + 128, 0.012
seats = max(n for n in range(1, 1025) if step.predict_features(n, n, n * context) <= tpot_bound)
decode_per_s = seats / (256 * step.predict_features(seats, seats, seats * context))
envelope = {f"{p}P{d}D": min(p * prefill_per_s, d * decode_per_s) for p, d in ((1, 2), (2, 1))}
print(f"a prefill GPU: {prefill_per_s:.1f} prompts/s; a decode GPU: {seats} seats under "
      f"{tpot_bound * 1e3:.0f} ms, {decode_per_s:.1f} answers/s")
print("what each split carries at most (req/s):", {k: round(v, 1) for k, v in envelope.items()})
expect_true("predicted (back-of-envelope): 1P2D is limited by its prefill GPU, 2P1D by its decode GPU",
            prefill_per_s < 2 * decode_per_s and decode_per_s < 2 * prefill_per_s,
            f"prefill {prefill_per_s:.1f}/s, decode {decode_per_s:.1f}/s per GPU")

# %% [markdown]
# So with one prefill GPU and two decode GPUs the prefill GPU is the limit, and with two and one
# the decode GPU is; the first carries a little more. The envelope ignores queueing (a GPU busy
# all the time makes requests wait without bound) and the SLO's 90%, so the real goodputs are
# lower. The sweep:

# %%
three = attainment_table(MODEL, GPU, 3, [6, 8, 9, 10, 11, 12, 13, 14, 16], {"ttft": 1.0, "tpot": 0.012},
                         num_requests=300, **long_traffic)
per_gpu = goodput_by_layout(three, 3)["goodput_per_gpu"]
ax = per_gpu.plot.bar(figsize=(5, 2.8), rot=0)
ax.set_ylabel("goodput per GPU (req/s)")
ax.set_title(f"Three GPUs: {per_gpu.idxmax()} carries the most per GPU")
plt.show()
expect_true("every goodput was found inside the sweep", bool(np.isfinite(per_gpu).all()))
expect_true("the back-of-envelope picked the sweep's better split", max(envelope, key=envelope.get) ==
            per_gpu[list(envelope)].idxmax(), {"envelope": envelope, "sweep": per_gpu[list(envelope)].round(2).to_dict()})
expect("one prefill GPU and two decode GPUs / two and one", per_gpu["1P2D"] / per_gpu["2P1D"], above=1)
expect("one prefill GPU and two decode GPUs / three colocated", per_gpu["1P2D"] / per_gpu["colocated"], above=1)
expect("two prefill GPUs and one decode GPU / three colocated", per_gpu["2P1D"] / per_gpu["colocated"], below=1.1)


def first_miss(layout: str) -> pd.Series:
    """The layout's row at the lowest swept rate where under 90% of requests met the SLO, with
    each percentile over its target (above 1: missed)."""
    rows = three[(three["layout"] == layout) & (three["num_good"] < 0.9 * three["num_requests"])]
    row = rows.sort_values("request_rate").iloc[0]
    return pd.Series({"rate": row["request_rate"], "TTFT p90 / 1 s": row["ttft_p90"] / 1.0,
                      "TPOT p90 / 12 ms": row["tpot_p90"] / 0.012})


misses = pd.DataFrame({layout: first_miss(layout) for layout in ("1P2D", "2P1D")}).T
print(misses.round(2).to_string())
expect_true("at the first rate each split misses: 2P1D's TPOT is further past its target than its TTFT, "
            "1P2D's TTFT further than its TPOT",
            misses.loc["2P1D", "TPOT p90 / 12 ms"] > misses.loc["2P1D", "TTFT p90 / 1 s"]
            and misses.loc["1P2D", "TTFT p90 / 1 s"] > misses.loc["1P2D", "TPOT p90 / 12 ms"], misses.round(2).to_dict())

# %% [markdown]
# The wrong ratio gains at most a tenth over not splitting at all: with two
# prefill GPUs and one decode GPU, the decode GPU's batch is full and TPOT breaks first. With one
# prefill GPU and two decode GPUs the prefill GPU is the limit (TTFT breaks first, as prompts
# queue for it), but at a higher rate. Production systems size the two pools from the traffic's
# prompt and answer lengths, and move GPUs between them as the mix changes.
#
# **What the papers measured.** DistServe (OSDI 2024) reports up to 7.4x more goodput per GPU
# than the systems it compared with (vLLM and DeepSpeed-MII; 4.48x in its first preprint) on
# chat, code completion and summarization with OPT-13B to 175B; its vLLM ran without chunked
# prefill, unlike the colocated replicas here, so it had more interference to remove. Splitwise
# (ISCA 2024) reports 1.4x the throughput at 20% lower cost. The figures above are the same
# shape under other conditions (another model, another GPU, this simulator's engine), not a
# reproduction of either.

# %% [markdown]
# ## For real: the protocol, on this machine
#
# The simulator prices the hand-off; a real deployment has to *do* it. `vllm-router` (notebook
# 12's router) has a disaggregated mode, `--vllm-pd-disaggregation`, with a `--prefill` and a
# `--decode` list of workers. For each client request it:
#
# 1. sends a copy to a prefill worker with `max_tokens` 1 and `kv_transfer_params`
#    `{"do_remote_decode": true}`: "compute the prompt, and keep its KV for someone else";
# 2. reads the `kv_transfer_params` of that answer (where the KV is: the prefill worker's host,
#    port and request id, and how many tokens), and sends the client's own request, with them,
#    to a decode worker;
# 3. streams the decode worker's answer back to the client.
#
# The course's server speaks both parts (`--kv-transfer-config`, vLLM's flag and JSON). A decode
# worker that gets such a request pulls the keys and values from the prefill worker over HTTP
# (`GET /batchlab/kv/{id}`: a connector of the course's own, where vLLM would use NIXL over RDMA)
# and checks that they fit (same model shape, dtype and prompt, a block size vLLM would accept);
# at the request's first step it takes KV blocks, writes the keys and values into them and
# computes only the last prompt token. (vLLM's decode worker takes the blocks first and pulls
# straight into them.)
# The prefill worker keeps each export until it is read once, or until a lease runs out.
#
# `PDLoopback` starts one prefill and one decode worker on the course's model (each a process of
# its own, on one core), the router in front, and here a colocated server beside them, all on
# 127.0.0.1. All three compute in fp32, named explicitly: a decode worker refuses KV in another
# dtype than its own, and fp32 makes "the same answer" an exact test. Eight requests of 96 prompt
# tokens and 24 answer tokens, at 2 a second, go to each (about 30 seconds, most of it loading):

# %%
from batchlab.launch.pd_loopback import PDLoopback, PDLoopbackConfig
from batchlab.engine_args import EngineArgs
from batchlab.loadgen import course_tokenizer, plan_requests, run_load
from batchlab.launch import launch_server, wait_ready

pd_config = PDLoopbackConfig(threads=1, engine=EngineArgs(max_num_seqs=4, max_model_len=512), dtype="float32")
real_load = plan_requests(8, prompt_len=96, output_len=24, tokenizer=course_tokenizer(), rate=2.0, id_prefix="pd")
colocated = launch_server(threads=1, dtype="float32", config=pd_config.colocated_config())
pd_servers = PDLoopback(pd_config)     # kept up for the last section: a fault
try:
    pd_servers.start()
    wait_ready(colocated)
    real = {"split": run_load(pd_servers.url, real_load, max_duration=120),
            "colocated": run_load(colocated.url, real_load, max_duration=120)}
except BaseException:
    pd_servers.stop()
    raise
finally:
    colocated.stop()

# %% [markdown]
# Every answer through the split, token for token, against the colocated server's: the decode
# worker continued from keys and values another process computed, and greedy decoding in fp32
# lands on the same tokens.

# %%
expect_true("every request through both ended with its answer (no error, no cut stream)",
            all(r.ok for result in real.values() for r in result.records),
            {name: result.status_counts() for name, result in real.items()})
texts = {name: [r.text for r in result.records] for name, result in real.items()}
same = sum(a == b for a, b in zip(texts["split"], texts["colocated"]))
print(f"{same} of {len(real_load)} answers identical; the first: {texts['split'][0][:60]!r}...")
expect_true("split and colocated give every request the same answer (fp32, greedy)", same == len(real_load),
            f"{same} of {len(real_load)}")

# %% [markdown]
# What moved: each answer carries the hand-off as the decode worker saw it (the course's server
# adds its own timings to the last chunk). The course's model keeps 30 layers x 3 key/value
# heads x 64 numbers x 2 x 4 bytes, 45 KiB of KV a prompt token in fp32:

# %%
hand_off = pd.DataFrame([{"request": r.request_id, "prompt tokens": r.prompt_len,
                          "KV bytes": r.server["kv_transfer"]["kv_bytes"],
                          "transfer ms": r.server["kv_transfer"]["transfer_s"] * 1e3,
                          "client TTFT ms": (r.chunk_times[0] - r.send_time) * 1e3}
                         for r in real["split"].records]).set_index("request")
print(hand_off.round(1).to_string())
per_token = 30 * 3 * 64 * 2 * 4
expect_true("each hand-off moved exactly the prompt's KV: tokens x layers x heads x head size x 2 x 4 bytes",
            (hand_off["KV bytes"] == hand_off["prompt tokens"] * per_token).tolist())

# %% [markdown]
# Over loopback HTTP a few megabytes take some milliseconds: a small part of the time to first
# token, which here is mostly the prompt's computation (and the wait for it) on one CPU core, as
# the colocated server's is. The client's latencies, both ways:

# %%
# NBVAL_IGNORE_OUTPUT
side = pd.DataFrame({name: summary_row(result.trace, percentiles=(50, 90)) for name, result in real.items()}).T
print((side[["ttft_p50", "ttft_p90", "itl_p50", "itl_p90"]] * 1e3).round(1).to_string())

# %% [markdown]
# Do not read a win or a loss into these numbers: the prefill and the decode worker share this
# machine's cores, the load is light, and there is no GPU whose decode steps a prefill could
# stall. What the real run shows is the mechanism (the protocol, the move, the identical
# answers); what it pays is the simulator's question, above.
#
# And a fault: the prefill worker is killed (a crash, mid-service) and one more request is sent.
# The router cannot reach it; the client should get an error that names the reason, at once,
# not a hang until its own timeout (60 s here):

# %%
pd_servers.kill("prefill", 0)
try:
    started = time.perf_counter()
    orphan = httpx.post(f"{pd_servers.url}/v1/completions", timeout=60,
                        json={"model": real["split"].model, "prompt": "Hello", "max_tokens": 4})
    orphan_s = time.perf_counter() - started
finally:
    pd_servers.stop()
print(f"HTTP {orphan.status_code} after {orphan_s:.2f} s: {orphan.text[:200]}")
expect("a dead prefill worker gets the client a server error", orphan.status_code, above=499)
expect("at once, not at the client's 60 s timeout (seconds)", orphan_s, below=5)
expect_true("and the error names the prefill worker it could not reach", "prefill" in orphan.text.lower(),
            orphan.text[:120])

# %% [markdown]
# ## Explore
#
# Prompt lengths, a TPOT bound and a link; one sweep of two GPUs runs per change (a few seconds).

# %%
def show_split(prompt_tokens=3000, tpot_ms=12, link="infiniband-ndr"):
    traffic = dict(prompt_len=Range(max(prompt_tokens // 2, 16), prompt_tokens), output_len=Range(128, 384))
    t = attainment_table(MODEL, GPU, 2, [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64], {"ttft": 1.0, "tpot": tpot_ms / 1e3},
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
#   disappear (the 99th-percentile gap fell to under half the colocated one here), paid for
#   in time to first token. A smaller colocated token budget (chunked prefill, notebook 06)
#   removes most of the same tail on the same GPUs, so a split's gain depends on its baseline.
# - The KV is 128 KiB per token for Llama-3-8B: a few milliseconds over InfiniBand or NVLink, a
#   tenth of a second over 25 Gb/s Ethernet, and transfers queue on a slow link, while the
#   decode worker holds blocks for KV that has not arrived.
# - It pays where prefill interference is what breaks the SLO (long prompts, a tight TPOT bound)
#   and loses where prompts are short: the split wastes the GPUs it set aside for prefill.
# - The prefill:decode ratio matters as much as the split itself: the wrong one gains little or
#   nothing over colocation.
# - For real, `vllm-router --vllm-pd-disaggregation` sends the prompt to a prefill worker with
#   `max_tokens` 1, passes the `kv_transfer_params` of its answer to a decode worker, and the
#   decode worker pulls the KV and answers the client. On the course's model in fp32 every answer
#   was the colocated server's, token for token; a dead prefill worker meant an error, not a hang.

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
# bounds (TTFT at most 1 s, TPOT at most 12 ms for 90% of requests). Sweep the rates 4, 8, ..., 32
# requests a second with 200 requests per point: which layout of `layouts(4)` (from
# `batchlab.cluster.pd_goodput`) has the highest goodput? Answer with its name, e.g. `"1P3D"`.

# %%
answer = None  # your code here
check("16.2", answer)
