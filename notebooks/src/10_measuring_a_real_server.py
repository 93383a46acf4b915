# %% [markdown]
# # 10 · Measuring a real server from the outside
#
# Every notebook so far measured the engine from the inside: the trace it writes about itself,
# in one Python process. The people who run LLM servers never see that trace. They see a server
# (vLLM, TGI, SGLang, llama.cpp) behind HTTP, answering in streamed chunks, with a queue they
# cannot look into. What *my request* experiences is what a client measures.
#
# So here batchlab becomes a real server: `python -m batchlab.serve` puts the same engine loop
# behind an OpenAI-compatible API, and `batchlab.loadgen` is a load client that measures any
# such server with the course's own definitions. We measure batchlab's server from outside and
# compare with what the engine says about the same requests, then run vLLM, the production
# engine the course keeps describing, on the same model on this CPU and load it the same way.
#
# ## What you will learn
#
# - How to start an OpenAI-compatible server (`start_server`) and stream from it: a response is
#   a series of server-sent events, each carrying a few characters of text.
# - What the client sees that the engine does not: **client TTFT against the engine's own
#   TTFT**, request by request. The difference is HTTP, tokenizing, detokenizing and the
#   event loop; the server's timings split the rest into queueing and prefill.
# - **Chunks against tokens**: a server may send several tokens in one chunk. A client that
#   counts one token per chunk reports a different ITL (or none at all).
# - **Open loop against closed loop**: a benchmark with a fixed number of concurrent users
#   never offers the server more than it can hold, so it hides queueing. Real users arrive on
#   their own clock.
# - What the server says about itself on **`/metrics`** (vLLM's Prometheus metrics), and what a
#   histogram's p99 can and cannot tell you.
# - **vLLM's own benchmark client** (`vllm bench serve`) against batchlab's server, beside the
#   course's client, and the same load against **vLLM** on the same model, when vLLM is set up.

# %% [markdown]
# ## Setup
#
# The model is loaded here only for its tokenizer and for a reference run; the servers load
# their own copies in their own processes. Every load below is bounded: a fixed number of
# requests and a time limit.

# %%
import json

import httpx
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from batchlab.analysis import metrics
from batchlab.analysis.claims import expect, expect_true
from batchlab.engine_args import EngineArgs
from batchlab.exercises import check
from batchlab.loadgen import plan_requests, prom, run_load
from batchlab.model import load_model
from batchlab.launch import VllmBench, start_server, start_vllm, vllm_status

# %% [markdown]
# The model is loaded once (a few seconds); every section below uses it.

# %%
lm = load_model()
tok = lm.tokenizer
VLLM_READY, why = vllm_status()          # vLLM's venv, for the last two sections
print(why)
ON_GPU = lm.device == "cuda"
N_REQUESTS = 32 if ON_GPU else 12        # requests per load
PROMPT_LEN, OUTPUT_LEN = 32, 12
SLOTS = 4                                # KV slots: at most this many requests run at once
print(f"{lm.name} on {lm.device} ({lm.dtype})")

# %% [markdown]
# ## A server, and one request by hand
#
# `start_server` runs `python -m batchlab.serve` in a subprocess on 127.0.0.1 and waits until its
# `/health` answers. This one serves continuous batching with room for 4 running requests.

# %%
server = start_server(policy="continuous", max_num_seqs=SLOTS, max_model_len=256)
print(server.url, httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"])

# %% [markdown]
# A streamed completion is an HTTP response that stays open: the server writes one event
# (`data: {...}`) per piece of text as tokens are produced, then `data: [DONE]`. We ask for
# exactly 12 tokens (`ignore_eos`, greedy), and for the running token count in every chunk
# (`continuous_usage_stats`, which vLLM also supports).

# %%
# NBVAL_IGNORE_OUTPUT
body = {"prompt": "The best way to learn to cook is", "max_tokens": OUTPUT_LEN, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True,
                                                               "continuous_usage_stats": True}}
events = []
with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
    for line in r.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[6:]))
for e in events[:3]:
    print({k: e[k] for k in ("choices", "usage")})
text_chunks = [e for e in events if e["choices"]]
print(f"{len(text_chunks)} chunks; the answer: {''.join(c['choices'][0]['text'] for c in text_chunks)!r}")

# %% [markdown]
# Each chunk carried one token (the running count goes up by one). The last token's chunk also
# carries the finish reason and the server's own timings for this request in an extension
# field, `"batchlab"`: when it arrived at the engine, was first scheduled, got its first token,
# finished. Those are what the engine's trace would record.

# %%
# NBVAL_IGNORE_OUTPUT
timing = text_chunks[-1]["batchlab"]
counts = [e["usage"]["completion_tokens"] for e in text_chunks]
assert counts == list(range(1, OUTPUT_LEN + 1))
assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"
assert timing["token_ids"] and len(timing["token_ids"]) == OUTPUT_LEN
assert timing["arrival_time"] <= timing["first_scheduled_time"] <= timing["first_token_time"]
pd.Series({k: timing[k] for k in ("queue_s", "ttft_s")}).round(4)

# %% [markdown]
# ## Client TTFT against the engine's own
#
# Now a real load: 12 requests of 32 prompt tokens and 12 output tokens, arriving as a Poisson
# stream at 2 per second (open loop: each is sent at its time, whatever the server is doing).
# `run_load` returns the client's records and builds from them the same `Trace` the engine
# produces, so `batchlab.analysis.metrics` reads it unchanged. `server_trace()` is the engine's own trace of
# the same requests, from the timings in the extension field, moved onto the client's clock.

# %%
# NBVAL_IGNORE_OUTPUT
reqs = plan_requests(N_REQUESTS, PROMPT_LEN, OUTPUT_LEN, tok, arrival="poisson", rate=2.0, seed=10)
scrape_before = prom.scrape(server.url)          # the server's /metrics, for later
poisson = run_load(server.url, reqs, target_rate=2.0, max_duration=120)
scrape_after = prom.scrape(server.url)
print(poisson.summary())
client = metrics.per_request_metrics(poisson.trace).set_index("request_id")
engine = metrics.per_request_metrics(poisson.server_trace()).set_index("request_id")
split = pd.DataFrame({"client_ttft": client["ttft"], "engine_ttft": engine["ttft"],
                      "queue": engine["queue_time"]})
split["outside_engine"] = split["client_ttft"] - split["engine_ttft"]
split["prefill"] = split["engine_ttft"] - split["queue"]
split.describe().loc[["mean", "50%", "max"]].round(4)

# %% [markdown]
# Every request's first token reached the client later than the engine computed it, and the
# difference, what HTTP, tokenizing the prompt, detokenizing and the event loop add, is a
# sliver: milliseconds at the median, under half of one decode step, and under a fifth of the
# client's TTFT for the median request (printed below). The other four fifths or more of a first
# token's wait are inside the engine: queueing for a slot (when requests arrive faster than slots
# free up), the step in progress, then the prompt's own step.

# %%
decode_step = np.median(metrics.itl_values(poisson.server_trace()))
outside_share = (split["outside_engine"] / split["client_ttft"]).median()
print(f"outside the engine: {1e3 * split['outside_engine'].median():.1f} ms at the median, {outside_share:.0%} of "
      f"the client's TTFT; a decode step: {1e3 * decode_step:.1f} ms")
assert (split["outside_engine"] > 0).all()
expect("time outside the engine / one decode step (medians)", split["outside_engine"].median() / decode_step,
       below=0.5)
expect("time outside the engine / the client's TTFT (median over requests)", outside_share, below=0.2)
assert (poisson.trace.requests_df()["num_output_tokens"] == OUTPUT_LEN).all()

# %%
order = split.sort_values("client_ttft").index
fig, ax = plt.subplots(figsize=(9, 3.2))
bottom = np.zeros(len(order))
for part, color in (("queue", "#bbbbbb"), ("prefill", "#ff7f0e"), ("outside_engine", "#1f77b4")):
    values = split.loc[order, part].to_numpy() * 1e3
    ax.bar(range(len(order)), values, bottom=bottom, color=color, label=part.replace("_", " "))
    bottom += values
ax.set_xlabel("request (sorted by client TTFT)")
ax.set_ylabel("ms")
ax.set_title(f"HTTP and the event loop add {outside_share:.0%} of a first token's wait (median request); "
             "the rest is inside the engine", fontsize=10)
ax.legend(frameon=False)
plt.show()

# %% [markdown]
# ## What the server says about itself: `/metrics`
#
# Production servers are watched through their metrics, scraped by Prometheus and drawn by
# Grafana. batchlab's server exposes the numbers vLLM exposes, under vLLM's names: requests
# running and waiting, KV-cache usage, token counters, and histograms of TTFT, inter-token
# latency, end-to-end latency and queue time. `prom.scrape` reads the text format into a table;
# we scraped just before and just after the Poisson load above.

# %%
# NBVAL_IGNORE_OUTPUT
print(httpx.get(f"{server.url}/metrics").text[:700])
families = scrape_after[scrape_after["family"].str.startswith("vllm:")]
families.groupby(["family", "type"]).size().rename("samples").reset_index().head(12)

# %% [markdown]
# Counters only grow, so a load's share is the difference of two scrapes. It matches what the
# client counted: 12 requests, 12 tokens each.

# %%
delta = {name: prom.counter_delta(scrape_before, scrape_after, name)
         for name in ("vllm:request_success", "vllm:generation_tokens", "vllm:prompt_tokens")}
print(delta)
assert delta["vllm:request_success"] == N_REQUESTS
assert delta["vllm:generation_tokens"] == N_REQUESTS * OUTPUT_LEN
assert delta["vllm:prompt_tokens"] == sum(r.usage_prompt_tokens for r in poisson.records)

# %% [markdown]
# A histogram keeps counts per bucket, not the values. A dashboard's "TTFT p99" is Prometheus'
# `histogram_quantile`: find the bucket holding the 99th-percentile rank and interpolate inside it.
# vLLM's TTFT buckets are 0.1, 0.25, 0.5, 0.75 s... wide at exactly the latencies people care
# about. Here is that estimate next to the exact p99 of the same requests (the engine's own
# TTFTs, from the extension field).

# %%
# NBVAL_IGNORE_OUTPUT
buckets = prom.histogram_buckets(scrape_after, "vllm:time_to_first_token_seconds", since=scrape_before)
estimate = prom.histogram_quantile(0.99, buckets)
exact = float(np.percentile(engine["ttft"], 99))
lower, upper = prom.bucket_of(estimate, buckets)
print(f"TTFT p99 from the histogram: {estimate * 1e3:.0f} ms (its bucket: {lower * 1e3:.0f} to "
      f"{upper * 1e3:.0f} ms); exact: {exact * 1e3:.0f} ms")
buckets[buckets.diff().fillna(buckets) > 0]

# %%
assert buckets.iloc[-1] == N_REQUESTS                         # every request observed once
expect_true("the exact p99 lies within one bucket width of the histogram's", abs(estimate - exact) <= upper - lower,
            f"{abs(estimate - exact) * 1e3:.0f} ms apart, bucket {(upper - lower) * 1e3:.0f} ms wide")

# %% [markdown]
# The histogram answers "which bucket"; the interpolation inside it assumes the bucket's
# observations are spread evenly from its lower to its upper bound. The p99 of a dozen requests
# is the slowest of them, and its rank sits near the top of its bucket, so the estimate lands
# near the bucket's upper bound wherever the slowest request really was: it can be off by almost
# a bucket's width, a quarter of a second with vLLM's TTFT buckets. Good enough to raise an
# alert; to compare two engines, measure per request, as the load client does.
#
# ## Chunks against tokens
#
# batchlab's continuous server sends one chunk per token. Not every server does: a server that
# batches whole requests and answers when the batch ends sends the whole answer in one chunk;
# vLLM, under load, may put several tokens in one chunk. Here is the same engine with dynamic
# batching that hands every response back when its batch ends (`release="batch"`, a
# non-streaming server), on the same requests at 4 per second.

# %%
# NBVAL_IGNORE_OUTPUT
batch_server = start_server(policy="dynamic", max_batch_size=SLOTS, batch_timeout=0.2, release="batch",
                            max_num_seqs=SLOTS, max_model_len=256)
whole = run_load(batch_server.url, reqs[:8], target_rate=4.0, max_duration=120)
batch_server.stop()
print(whole.summary())
pd.DataFrame({"chunks": [len(r.chunk_times) for r in whole.records],
              "tokens": [r.num_tokens for r in whole.records]}).value_counts()

# %% [markdown]
# Every response came as a single chunk of 12 tokens. Counting tokens, the client sees 11 gaps of
# 0 s per request and a TTFT equal to the whole response time; counting one token per chunk, it
# would see one token and no inter-token latency at all. The token counts come from the usage the
# server reports; without them a client can only count chunks.

# %%
assert all(len(r.chunk_times) == 1 and r.num_tokens == OUTPUT_LEN for r in whole.records)
assert len(whole.chunk_gaps()) == 0
whole_m = metrics.per_request_metrics(whole.trace)
assert (metrics.itl_values(whole.trace) == 0).all() and np.allclose(whole_m["ttft"], whole_m["e2e"])
assert (poisson.chunk_gaps() > 0).all() and len(poisson.chunk_gaps()) == len(metrics.itl_values(poisson.trace))

# %% [markdown]
# ## Open loop against closed loop
#
# Many benchmarks run a *closed loop*: a fixed number of virtual users, each sending its next
# request as soon as its last one ends. With 4 users and 4 slots, a request never waits for a
# slot: the client itself waits. Then we send the same requests in an *open loop*, bursty arrivals
# (gamma gaps, burstiness 0.3) at the very rate the closed loop achieved. The server's own
# queue times, from the extension field, show who waited.

# %%
# NBVAL_IGNORE_OUTPUT
closed = run_load(server.url, reqs, mode="closed", concurrency=SLOTS, max_duration=120)
rate = closed.rate_report()["achieved_rate"]
bursty_reqs = plan_requests(N_REQUESTS, PROMPT_LEN, OUTPUT_LEN, tok, arrival="gamma", rate=rate,
                            burstiness=0.3, seed=10)
bursty = run_load(server.url, bursty_reqs, target_rate=rate, max_duration=120)
print(closed.summary(), bursty.summary(), sep="\n")
rows = {}
for name, res in (("closed loop, 4 users", closed), ("open loop, bursty", bursty)):
    # queue: the server's own (arrival at the engine to its first step); TTFT: what the client saw
    server_m, client_m = (metrics.per_request_metrics(t) for t in (res.server_trace(), res.trace))
    rows[name] = {"achieved_rate": res.rate_report()["achieved_rate"],
                  "queue_p90": server_m["queue_time"].quantile(0.9), "queue_max": server_m["queue_time"].max(),
                  "ttft_p50": client_m["ttft"].median(), "ttft_p90": client_m["ttft"].quantile(0.9)}
loops = pd.DataFrame(rows).T
loops.round(3)

# %% [markdown]
# At about the same average rate, the closed loop's requests hardly waited at the server: each
# user sends only when its own request has ended, so a slot is always free and the wait is at
# most the step in progress. We can count that wait in steps from the server's token times alone:
# every instant at which some request got a token is the end of a step, so a request's wait spans
# the step ends between its arrival and its first scheduling. The bursty open loop made requests
# queue for slots, through many steps, and its tail TTFT is much longer. A closed-loop benchmark
# cannot show this: its load adapts to the server.

# %%
# NBVAL_IGNORE_OUTPUT
waited = {name: metrics.steps_waited(res.server_trace()) for name, res in
          (("closed loop, 4 users", closed), ("open loop, bursty", bursty))}
for name, steps in waited.items():
    print(f"{name}: steps waited before the first scheduling, per request: {steps.tolist()}")
expect("closed loop: the most steps a request waited through", waited["closed loop, 4 users"].max(), below=1.5)
expect("bursty open loop: the most steps a request waited through", waited["open loop, bursty"].max(), above=5)
expect("longest queue wait, bursty open loop / closed loop",
       loops.loc["open loop, bursty", "queue_max"] / loops.loc["closed loop, 4 users", "queue_max"], above=2)
expect("TTFT p90, bursty open loop / closed loop",
       loops.loc["open loop, bursty", "ttft_p90"] / loops.loc["closed loop, 4 users", "ttft_p90"], above=1.3)

# %%
fig, ax = plt.subplots(figsize=(7, 3.2))
for name, res in (("closed loop, 4 users", closed), ("open loop, bursty", bursty)):
    ttft = np.sort(metrics.per_request_metrics(res.trace)["ttft"].to_numpy())
    ax.step(ttft, np.arange(1, len(ttft) + 1) / len(ttft), where="post", label=name)
ax.set_xlabel("client TTFT (s)")
ax.set_ylabel("share of requests")
ax.set_title("Same rate, same server: bursty users wait, a closed loop hides it")
ax.legend(frameon=False)
plt.show()

# %% [markdown]
# ## vLLM's own benchmark client against batchlab's server
#
# Any OpenAI-compatible server can be measured by the ecosystem's standard tools. Here is
# `vllm bench serve`, unchanged, run from vLLM's venv against batchlab's server: it finds the
# model and its tokenizer in `/v1/models`, checks its random prompts' lengths with the server's
# `/tokenize`, and streams them one at a time; then the course's client sends prompts of the same
# lengths the same way. Both time a request from just before it is sent: vLLM's TTFT ends at the
# first chunk, its ITL is the gap between chunks; the course's client counts tokens (here each
# chunk carries one, so the two definitions meet). The two take turns three times: a median over
# six requests moves by a tenth or more from one run to the next on a shared CPU, and a moment of
# other work hits one run of one client, not the median of three pairs.

# %%
# NBVAL_IGNORE_OUTPUT
pairs = []
if VLLM_READY:
    vllm_client = VllmBench()    # vLLM's client in one Python for all three runs: its import paid once, now
    # Warm the server first (not measured), so that neither client meets the first steps'
    # one-time costs (the CPU kernels' per-shape set-up): the client that ran first would.
    run_load(server.url, plan_requests(6, 32, OUTPUT_LEN, tok, arrival="at_once", seed=2),
             max_concurrency=1, max_duration=120)
    with vllm_client:
        for seed in (0, 1, 2):
            bench = vllm_client.run(server.url, [
                "--backend", "openai", "--endpoint", "/v1/completions", "--dataset-name", "random",
                "--random-input-len", "32", "--random-output-len", str(OUTPUT_LEN), "--num-prompts", "6",
                "--max-concurrency", "1", "--ignore-eos", "--temperature", "0", "--disable-tqdm", "--seed", str(seed)])
            ours = run_load(server.url, plan_requests(6, 32, OUTPUT_LEN, tok, arrival="at_once", seed=3 + seed),
                            max_concurrency=1, warmup=1, max_duration=120).table()
            pairs.append(pd.DataFrame({"vllm bench serve": [bench["median_ttft_ms"], bench["median_itl_ms"]],
                                       "batchlab.loadgen": [ours.loc["ttft", "p50"] * 1e3, ours.loc["itl", "p50"] * 1e3]},
                                      index=["TTFT p50 (ms)", "ITL p50 (ms)"]))
    print(bench["stdout"][bench["stdout"].index("====="):])          # the last of vLLM's reports
    display(pd.concat(pairs, keys=["pair 1", "pair 2", "pair 3"]).round(1))

# %%
if pairs:
    ratios = pd.concat([p["batchlab.loadgen"] / p["vllm bench serve"] for p in pairs], axis=1)
    expect("the two clients' TTFT and ITL medians, ours / vLLM's, the median of three pairs",
           ratios.median(axis=1), above=0.75, below=1.33)

# %% [markdown]
# ## The same load against vLLM
#
# vLLM's CPU build runs in a venv of its own beside the course's (`bash scripts/setup_vllm.sh`
# makes `.venv-vllm/`; CI sets it up). `start_vllm` starts its OpenAI server on the same converted
# model folder, in fp32, with the same 4 sequences at most, and waits until it is healthy (about
# 80 s on two cores). It starts vLLM *eager* (`--enforce-eager`: no torch.compile, which would
# add over a minute to every start on this machine) and with its periodic stats log off
# (`--disable-log-stats`). In one side-by-side run on this machine eager decoding was about 15%
# slower than compiled, so read vLLM's decode latencies below as a little pessimistic. The load
# client does not care whose server it measures.

# %%
# NBVAL_IGNORE_OUTPUT
vllm_result = None
if VLLM_READY:
    vllm = start_vllm(EngineArgs(max_model_len=256, max_num_seqs=SLOTS, disable_log_stats=True))
    try:
        vllm_result = run_load(vllm.url, reqs, target_rate=2.0, max_duration=180)
    finally:
        vllm.stop()
    print(vllm_result.summary())

# %% [markdown]
# Both servers got the same 12 requests at the same times. With greedy sampling in fp32 they
# compute the same model, so they must produce the same text, request by request; their
# latencies differ with their engines (vLLM here runs on one of the two cores: it reserves the
# other for its own server process). When the course runs in bf16 (`BATCHLAB_DTYPE=bfloat16`, or
# a CPU on which `dtype="auto"` picks it), batchlab's server computes in bf16 against vLLM's fp32,
# and a text may part from vLLM's at a near-tie, as notebook 04 measured.

# %%
# NBVAL_IGNORE_OUTPUT
if vllm_result is not None:
    assert all(r.ok for r in vllm_result.records)
    ours = {r.request_id: r.text for r in poisson.records}
    same = sum(r.text == ours[r.request_id] for r in vllm_result.records)
    print(f"{same} of {len(ours)} texts identical (batchlab in {lm.dtype}, vLLM in float32)")
    if lm.dtype == "float32":
        assert same == len(ours) == len(vllm_result.records), same
    side = pd.DataFrame({name: metrics.summary_row(res.trace, percentiles=(50, 90))
                         for name, res in (("batchlab", poisson), ("vLLM", vllm_result))}).T
    display(side[["request_throughput", "output_throughput", "ttft_p50", "ttft_p90", "itl_p50", "e2e_p50"]].round(3))
else:
    print("vLLM is not set up here, so there is no side-by-side. To set it up (a few minutes, once):\n"
          "    bash scripts/setup_vllm.sh\nthen run this notebook again.")

# %%
_ = server.stop()

# %% [markdown]
# ## Summary
#
# - `python -m batchlab.serve` serves the course's engine over an OpenAI-compatible API; a
#   streamed response is one server-sent event per piece of text, and batchlab's carries the
#   server's own timings in an extension field.
# - The load client measures any such server with the course's definitions and builds the same
#   `Trace` the engine writes, so every metric works on client-side data.
# - Client TTFT was later than the engine's own for every request, by milliseconds at the
#   median, under half a decode step and under a fifth of the client's TTFT: HTTP and
#   detokenizing are a sliver; the wait is inside the engine.
# - `/metrics` speaks vLLM's metric names; counters are read as differences of two scrapes, and a
#   histogram's p99 is only as fine as its buckets.
# - Count tokens, not chunks: a server that sends a whole answer in one chunk shows no
#   inter-token gaps, and its TTFT is its whole response time.
# - vLLM's own benchmark client measures batchlab's server as it measures vLLM, and agrees with
#   the course's client where their definitions meet.
# - A closed loop with as many users as slots never waited for more than the step in progress;
#   bursty open-loop users at about the same rate queued for slots through many steps and waited
#   much longer at the tail.
#   Benchmark with open loops.
# - vLLM on the same model gives the same greedy text; the same client measures it.
#
# Next: the capstone, notebook 11, diagnoses unnamed traces: is it queueing and prefill, or
# decode throughput?

# %% [markdown]
# ## Exercises
#
# Each exercise asks for a function of the load client's records (`ClientRecord`: `send_time`,
# `end_time`, `chunk_times`, `chunk_tokens`, and `server`, the server's own timings). The checker
# runs your function on records of its own. Worked solutions are in
# `solutions/10_measuring_a_real_server.py`.
#
# **10.1** Write `client_overhead(records)`: the median over requests of the client's TTFT
# (first chunk minus send) minus the server's own TTFT (`r.server["ttft_s"]`), in seconds.

# %%
answer = None  # your code here
check("10.1", answer)

# %% [markdown]
# **10.2** Write `token_gaps(record)`: the gaps between successive *tokens* of one request, given
# that every token in a chunk became visible when its chunk arrived.

# %%
answer = None  # your code here
check("10.2", answer)

# %% [markdown]
# **10.3** Write `max_in_flight(records)`: the most requests in flight (sent, not yet ended) at any
# moment. For a closed loop it is the number of users; what is it for the bursty open loop above?

# %%
answer = None  # your code here
check("10.3", answer)
