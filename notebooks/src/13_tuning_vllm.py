# %% [markdown]
# # 13 · Tuning vLLM: predict a knob's effect, then measure it
#
# The course built a simulator of a continuous-batching server, a cost model that prices each
# step, a load client and the metric definitions that engines use. On the job you will not tune
# batchlab: you will tune vLLM (or SGLang, or TGI) with flags, and watch it through its
# `/metrics`. This notebook puts the course's tools to that use on vLLM itself, running on this
# CPU and serving the course's model: calibrate the simulator to vLLM from outside, predict what a
# flag will do, then turn the flag and measure, and write down how far off the prediction was.
#
# ## What you will learn
#
# - **vLLM's flags and V1's defaults**, set beside batchlab's knobs and SGLang's flags, and where
#   V1's defaults differ from what earlier notebooks used.
# - **Outside-in calibration**: the course's four-term cost model fitted to a server you can only
#   reach over HTTP, from lone prompts (prefill) and concurrent decodes (per-sequence cost).
# - **Predict, then measure** `--max-num-seqs` (throughput against time to first token at the
#   same offered load) and prefix caching with a shared system prompt (one server, with vLLM's
#   `cache_salt` keeping some requests out of the shared cache), and `--max-num-batched-tokens`
#   with chunked prefill (a long prompt arriving among streaming chats: their ITL p99 against the
#   newcomer's TTFT).
# - **Reading vLLM's `/metrics`**: running and waiting requests, KV-cache usage, prefix-cache
#   queries and hits, preemptions, and its latency histograms, whose p99 we set against the
#   client's exact p99.
# - How big each prediction error is, including the ones that miss.

# %% [markdown]
# ## Setup
#
# vLLM's CPU build runs in a venv of its own (`bash scripts/setup_vllm.sh` makes `.venv-vllm/`;
# CI sets it up) and is never imported here: `start_vllm` runs its OpenAI server as a
# subprocess on 127.0.0.1, on the course's converted model in fp32. Every load is bounded.
# Three servers are started in all, one after the other: each start costs some 30-90 s on two cores.

# %%
import os
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from batchlab.analysis import metrics
from batchlab.analysis.claims import expect, expect_true
from batchlab.exercises import check
from batchlab.loadgen import LoadRequest, course_tokenizer, plan_requests, run_load
from batchlab.loadgen.calibrate import calibrate_outside_in, fresh_prompts
from batchlab.loadgen.predict import compare, load_figures, newcomer_figures, simulate_load
from batchlab.serve import prom
from batchlab.serve.vllm_flags import FLAG_TABLE, VLLMFlags
from batchlab.serve.vllm_ref import VLLMUnavailable, ensure_running, start_vllm, vllm_status

# %%
tok = course_tokenizer()
VLLM_READY, why = vllm_status()
print(why)
if not VLLM_READY and os.environ.get("CI"):
    raise RuntimeError(f"CI sets vLLM up with scripts/setup_vllm.sh, but: {why}")


def start(flags: VLLMFlags):
    """vLLM with these flags, or None with one sentence saying why it could not start."""
    if not VLLM_READY:
        print(f"Skipped: {why}")
        return None
    t0 = time.perf_counter()
    try:
        server = start_vllm(max_model_len=1024, kv_cache_gib=2, flags=flags)
    except VLLMUnavailable as e:
        print(f"vLLM did not start, so this section has no measurement; fix what its log says, then rerun:\n{e}")
        return None
    print(f"vLLM {' '.join(flags.args())} healthy after {time.perf_counter() - t0:.0f} s")
    return server


# %% [markdown]
# ## The flags, and V1's defaults
#
# Every batchlab knob has a vLLM flag. `VLLMFlags` holds the ones this notebook turns and writes
# vLLM's command line; a flag left at `None` keeps vLLM's default.

# %%
FLAG_TABLE

# %%
print(VLLMFlags(max_num_seqs=2, prefix_caching=False).args())

# %% [markdown]
# Three of vLLM V1's defaults differ from what earlier notebooks mostly used:
#
# - **Prefix caching is on.** Notebooks 02-11 ran with it off (only notebook 05's prefix section
#   turns it on), so their TTFTs are those of prompts computed in full. On vLLM V1 a repeated
#   prefix is served from the cache unless it is turned off (`--no-enable-prefix-caching`) or a
#   request carries its own `cache_salt`.
# - **Chunked prefill is on**, with a token budget of 2,048 per step on a CPU (8,192 on an
#   H100). Notebook 06 compared chunked and unchunked prefill with budgets of 64-512 tokens; at
#   2,048, a prompt shorter than the budget is computed in one step, and chunking matters only
#   for longer prompts or many arriving together.
# - **`--max-num-seqs` is 128 on a CPU** (256 on most GPUs, 1,024 on an H100), where the earlier
#   notebooks used 4-32. On a CPU the KV cache is what you give it (`VLLM_CPU_KVCACHE_SPACE`);
#   here 2 GiB, 46,592 tokens in blocks of 128 (a GPU's block is 16 tokens).
#
# ## Start vLLM with its metrics on
#
# The first server keeps V1's defaults for every scheduling knob. Its `/metrics` says how it was
# configured (`vllm:cache_config_info`, a gauge whose labels carry the settings).

# %%
# NBVAL_IGNORE_OUTPUT
server = start(VLLMFlags())

# %%
if server is not None:
    info = prom.scrape(server.url).query("family == 'vllm:cache_config_info'")["labels"].iloc[0]
    print({k: info[k] for k in ("enable_prefix_caching", "block_size", "num_gpu_blocks", "kv_cache_size_tokens")})
    expect_true("V1 turns prefix caching on by default", info["enable_prefix_caching"] == "True",
                info["enable_prefix_caching"])
    BLOCK = int(info["block_size"])
    expect("tokens per KV block on this CPU", BLOCK, above=16)

# %% [markdown]
# ## Calibrate the simulator to vLLM, from outside
#
# We cannot time vLLM's steps from inside, but two kinds of controlled runs show them from
# outside (`batchlab.loadgen.calibrate`):
#
# - a prompt sent **alone**, asking for one token: its TTFT is one prefill step of the whole
#   prompt, plus the HTTP round trip. Prompts of 16, 128, 256 and 512 tokens, three each;
# - **k requests sent together**, 40 tokens each: once their prompts are in, every step decodes
#   all k, so the median gap between a request's tokens is one decode step of k sequences. k is
#   1, 2, 4 and 16.
#
# Each gives one row of features (sequences, tokens, attention pairs) and a duration, and the
# course's cost model is fitted to the eight rows. Every prompt is a new stretch of the corpus,
# so the prefix cache has nothing to serve.

# %%
# NBVAL_IGNORE_OUTPUT
cal = None
if server is not None:
    ensure_running(server)
    cal = calibrate_outside_in(server.url, tok, source="vLLM 0.32 CPU, SmolLM2-135M fp32, from outside")
    cost = cal.cost_model
    print(cost)
    display(cal.points.round(4))

# %% [markdown]
# The fit and its error, point by point:

# %%
if cal is not None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, kind, xlabel in ((axes[0], "prefill", "prompt tokens (alone)"), (axes[1], "decode", "sequences decoding together (k)")):
        pts = cal.points[cal.points["kind"] == kind]
        ax.plot(pts["size"], pts["duration"] * 1e3, "o", label="measured (median)")
        ax.plot(pts["size"], pts["predicted"] * 1e3, "x-", label="fitted cost model")
        ax.set(xlabel=xlabel, ylabel="ms", title=f"{kind}: worst error {pts['rel_error'].abs().max():.0%}")
        ax.legend()
    fig.suptitle(f"Eight outside measurements fit the four-term cost model within "
                 f"{cal.median_rel_error:.0%} at the median")
    plt.tight_layout()
    plt.show()
    expect("median error of the outside-in fit", cal.median_rel_error, below=0.15)
    decode = cal.points[cal.points["kind"] == "decode"].set_index("size")["duration"]
    expect("decode step of 16 sequences / of 1", decode[16] / decode[1], below=2.5)

# %% [markdown]
# A prompt's tokens cost a couple of milliseconds each on this CPU, and a step costs some 50 ms
# before it computes anything (the weights read once, vLLM's scheduling and the HTTP round trip
# all land in the fixed term). Decoding 16 sequences at once takes well under two and a half times
# as long as decoding one, for sixteen times the tokens: that is what `--max-num-seqs` trades on.
# The line fits the small decodes least well: vLLM's step time from 1 to 4 sequences is not a
# straight line, and its shape moves from run to run (compare the two points with the line).
#
# ## Predict, then measure: `--max-num-seqs`
#
# One load, two servers: 24 requests (prompts of 64 tokens, 32 output tokens) arriving at random
# (Poisson) at 4 per second, served with `--max-num-seqs 128` (V1's default here) and with `2`.
# First the prediction: the same requests on the course's simulator, with the fitted cost model
# and vLLM's scheduling defaults.

# %%
load = plan_requests(24, prompt_len=64, output_len=32, tokenizer=tok, arrival="poisson", rate=4.0,
                     id_prefix="knob-")
SMALL, LARGE = 2, 128
predicted = {}
if cal is not None:
    predicted = {k: simulate_load(cost, load, max_num_seqs=k, block_size=BLOCK) for k in (SMALL, LARGE)}
    display(pd.DataFrame({f"max_num_seqs={k}": load_figures(t) for k, t in predicted.items()}).round(3))

# %% [markdown]
# The simulator expects the large setting to serve several times more tokens per second at this
# load, with a far earlier first token, for a slightly slower stream (bigger steps). Now the
# measurement on the running server, watching its queue through `/metrics` while the load runs
# (`GaugeSampler` scrapes it every 0.25 s).

# %%
GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]


def measure(server, requests):
    """The load, with /metrics scraped before, after and every 0.25 s during it."""
    ensure_running(server)
    before = prom.scrape(server.url)
    with prom.GaugeSampler(server.url, GAUGES) as sampler:
        result = run_load(server.url, requests, max_duration=300)
    ensure_running(server)
    return result, before, prom.scrape(server.url), sampler.frame()


# %%
# NBVAL_IGNORE_OUTPUT
measured = {}
if server is not None:
    measured[LARGE] = measure(server, load)
    print(measured[LARGE][0].summary())

# %% [markdown]
# ## Reading vLLM's `/metrics`
#
# Counters are read as the difference of two scrapes; gauges say what holds at the moment of a
# scrape. During that load:

# %%
if LARGE in measured:
    result, before, after, gauges = measured[LARGE]
    delta = {name: prom.counter_delta(before, after, name) for name in
             ("vllm:request_success", "vllm:generation_tokens", "vllm:prompt_tokens", "vllm:num_preemptions")}
    print(delta)
    print(gauges.max().round(3).to_dict())
    expect("requests vLLM counted as done", delta["vllm:request_success"], above=23, below=25)
    expect("tokens vLLM counted as generated", delta["vllm:generation_tokens"], above=24 * 32 - 1, below=24 * 32 + 1)
    expect("preemptions (the KV cache never ran short)", delta["vllm:num_preemptions"], below=0.5)
    expect("most requests running at once", gauges["vllm:num_requests_running"].max(), above=2)
    expect("peak KV-cache usage (fraction)", gauges["vllm:kv_cache_usage_perc"].max(), below=0.2)

# %% [markdown]
# vLLM's latency histograms store counts per bucket, not the values: a p99 read from them
# (`histogram_quantile`, as Grafana computes it) is an interpolation inside the bucket the 99th
# percentile falls in. The client knows every value, so its p99 is exact. They also time slightly
# different things: vLLM's TTFT starts when the request reaches its engine, the client's before
# the POST.

# %%
HISTOGRAMS = {"ttft": "vllm:time_to_first_token_seconds", "itl": "vllm:inter_token_latency_seconds",
              "e2e": "vllm:e2e_request_latency_seconds"}
if LARGE in measured:
    result, before, after, _ = measured[LARGE]
    rows = {}
    for metric, family in HISTOGRAMS.items():
        buckets = prom.histogram_buckets(after, family, since=before)
        exact = float(np.percentile(metrics.latency_values(result.trace, metric), 99))
        estimate = prom.histogram_quantile(0.99, buckets)
        (low, high), (hlow, hhigh) = prom.bucket_of(exact, buckets), prom.bucket_of(estimate, buckets)
        rows[metric] = {"client p99 (exact)": exact, "histogram p99": estimate,
                        "bucket of the exact p99": f"({low:g}, {high:g}]",
                        "bucket of the histogram's p99": f"({hlow:g}, {hhigh:g}]",
                        "wider bucket": max(high - low, hhigh - hlow)}
    hist = pd.DataFrame(rows).T
    hist["off by"] = (hist["histogram p99"] - hist["client p99 (exact)"]).abs()
    display(hist)
    expect("histogram p99 error / the wider of the two buckets", (hist["off by"] / hist["wider bucket"]).astype(float),
           below=1.0)

# %% [markdown]
# The histogram's p99 is off by up to a bucket's width, and vLLM's buckets are wide where tails
# live (TTFT: 0.5, 0.75, 1, 2.5, 5 s): a TTFT p99 of 1.1 s and one of 2.4 s read the same bucket.
# When the exact p99 sits just above a bucket's edge, the estimate lands in the next, wider bucket.
# For an SLO near a bucket's edge, measure from the client, or start vLLM with finer buckets
# (`--custom-histogram-buckets`, in its observability settings).
#
# ## Prefix caching with a shared system prompt, on one server
#
# Sixteen requests share a system prompt of 384 tokens, each followed by its own 32-token
# question, sent one at a time. The first eight each carry their own `cache_salt`: vLLM mixes the
# salt into the hash of the first block, so a salted request can only reuse blocks made under the
# same salt, never the shared ones. The last eight carry none and share the cache. The
# prediction: the simulator's paged cache, with and without prefix caching.

# %%
prefix_result = {}
if server is not None:
    system = fresh_prompts(tok, 1, 384)[0]
    questions = fresh_prompts(tok, 16, 32)
    prefix_loads = {
        "salted": [LoadRequest(f"salted-{i}", system + q, 8, prompt_len=416, extra_body={"cache_salt": f"user-{i}"})
                   for i, q in enumerate(questions[:8])],
        "shared": [LoadRequest(f"shared-{i}", system + q, 8, prompt_len=416) for i, q in enumerate(questions[8:])]}
    for name, reqs in prefix_loads.items():
        ensure_running(server)
        before = prom.scrape(server.url)
        res = run_load(server.url, reqs, mode="closed", concurrency=1, max_duration=300)
        after = prom.scrape(server.url)
        prefix_result[name] = {"ttft_p50": float(np.median([r.ttft for r in res.records])),
                               "queried": prom.counter_delta(before, after, "vllm:prefix_cache_queries"),
                               "hit": prom.counter_delta(before, after, "vllm:prefix_cache_hits")}
    # One at a time: the simulator gets the same requests 10 s apart, so none waits for another.
    apart = lambda reqs: [LoadRequest(r.request_id, r.prompt, r.max_tokens, 10.0 * i) for i, r in enumerate(reqs)]
    for name, reqs in prefix_loads.items():
        sim = simulate_load(cost, apart(reqs), prefix_caching=(name == "shared"), block_size=BLOCK)
        prefix_result[name]["predicted ttft_p50"] = float(np.median(metrics.latency_values(sim, "ttft")))
    display(pd.DataFrame(prefix_result).T)

# %% [markdown]
# vLLM caches whole blocks only, and never the prompt's last token (it must be computed to give
# the first output token). So each shared request after the first finds 3 blocks of 128 = 384
# tokens, and the salted ones find nothing:

# %%
if prefix_result:
    expect("prompt tokens served from the cache, salted requests", prefix_result["salted"]["hit"], below=0.5)
    expect("prompt tokens served from the cache, shared requests (7 x 384 expected)",
           prefix_result["shared"]["hit"], above=7 * 384 - 0.5, below=7 * 384 + 0.5)
    measured_gain = prefix_result["salted"]["ttft_p50"] / prefix_result["shared"]["ttft_p50"]
    predicted_gain = prefix_result["salted"]["predicted ttft_p50"] / prefix_result["shared"]["predicted ttft_p50"]
    print(f"TTFT p50 without / with the shared cache: measured {measured_gain:.1f}x, predicted {predicted_gain:.1f}x "
          f"(prediction error {predicted_gain / measured_gain - 1:+.0%})")
    expect("TTFT p50 without / with the shared cache, measured", measured_gain, above=3)

# %% [markdown]
# ## Predict, then measure: the token budget with chunked prefill
#
# Six chats are streaming (prompts of 32 tokens, 64 output tokens each) when a prompt of 768
# tokens arrives, one second in. With V1's budget of 2,048 tokens a step, the whole prompt is
# computed in one step, and every chat waits for that step: one long gap in each stream. With a
# budget of 128 (`--max-num-batched-tokens 128`, a second server later), the prompt is cut into
# chunks that share steps with the chats' decodes: many shorter gaps, and a later first token for
# the newcomer. First the prediction for both budgets, then the default on this server.

# %%
BUDGETS, NEWCOMER = (2048, 128), "newcomer"
newcomer_load = ([LoadRequest(f"chat-{i}", p, 64, 0.0, prompt_len=32) for i, p in enumerate(fresh_prompts(tok, 6, 32))]
                 + [LoadRequest(NEWCOMER, fresh_prompts(tok, 1, 768)[0], 4, 1.0, prompt_len=768)])
budget_pred, budget_meas = {}, {}
if cal is not None:
    budget_pred = {b: newcomer_figures(simulate_load(cost, newcomer_load, max_num_batched_tokens=b, block_size=BLOCK),
                                       NEWCOMER) for b in BUDGETS}
    display(pd.DataFrame(budget_pred).round(3))

# %%
# NBVAL_IGNORE_OUTPUT
if server is not None:
    ensure_running(server)
    budget_meas[2048] = newcomer_figures(run_load(server.url, newcomer_load, max_duration=120).trace, NEWCOMER)
    print(budget_meas[2048])

# %%
# NBVAL_IGNORE_OUTPUT
if server is not None:
    server.stop()

# %% [markdown]
# ## The same load with `--max-num-seqs 2`
#
# A second server, all else equal. At 4 requests a second, two sequences at a time cannot keep
# up: the rest wait, and `vllm:num_requests_waiting` shows the queue.

# %%
# NBVAL_IGNORE_OUTPUT
small = start(VLLMFlags(max_num_seqs=SMALL))
if small is not None:
    try:
        run_load(small.url, [LoadRequest("warm-up", fresh_prompts(tok, 1, 64)[0], 4)], max_duration=120)
        measured[SMALL] = measure(small, load)
        print(measured[SMALL][0].summary())
    finally:
        small.stop()

# %%
if SMALL in measured and LARGE in measured:
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for k, style in ((SMALL, "-"), (LARGE, "--")):
        g = measured[k][3]
        ax.plot(g["t"], g["vllm:num_requests_waiting"], style, label=f"waiting, max_num_seqs={k}")
        ax.plot(g["t"], g["vllm:num_requests_running"], style, alpha=0.5, label=f"running, max_num_seqs={k}")
    waiting_max = measured[SMALL][3]["vllm:num_requests_waiting"].max()
    ax.set(xlabel="seconds into the load", ylabel="requests",
           title=f"With 2 sequences at a time up to {waiting_max:.0f} requests wait; with 128, none")
    ax.legend(fontsize=8)
    plt.show()
    expect("most requests running at once with --max-num-seqs 2", measured[SMALL][3]["vllm:num_requests_running"].max(),
           above=1.5, below=2.5)
    expect("most requests waiting with --max-num-seqs 2 (sampled)", waiting_max, above=5)
    expect("most requests waiting with --max-num-seqs 128 (sampled)",
           measured[LARGE][3]["vllm:num_requests_waiting"].max(), below=1.5)

# %% [markdown]
# And the third server, with a budget of 128 tokens a step, for the newcomer's load:

# %%
# NBVAL_IGNORE_OUTPUT
chunky = start(VLLMFlags(max_num_batched_tokens=128))
if chunky is not None:
    try:
        run_load(chunky.url, [LoadRequest("warm-up", fresh_prompts(tok, 1, 64)[0], 4)], max_duration=120)
        ensure_running(chunky)
        budget_meas[128] = newcomer_figures(run_load(chunky.url, newcomer_load, max_duration=120).trace, NEWCOMER)
        ensure_running(chunky)
    finally:
        chunky.stop()

# %%
if len(budget_meas) == 2 and budget_pred:
    budget = pd.concat({f"budget {b}": pd.DataFrame({"predicted": budget_pred[b], "measured": budget_meas[b]})
                        for b in BUDGETS}, axis=1)
    display(budget.round(3))
    itl_gain = {src: d[2048]["others_itl_p99"] / d[128]["others_itl_p99"] for src, d in
                (("predicted", budget_pred), ("measured", budget_meas))}
    ttft_cost = {src: d[128]["newcomer_ttft"] / d[2048]["newcomer_ttft"] for src, d in
                 (("predicted", budget_pred), ("measured", budget_meas))}
    print(f"chats' ITL p99, budget 2048 / 128: predicted {itl_gain['predicted']:.1f}x, measured {itl_gain['measured']:.1f}x")
    print(f"newcomer's TTFT, budget 128 / 2048: predicted {ttft_cost['predicted']:.2f}x, measured {ttft_cost['measured']:.2f}x")
    expect("chats' ITL p99, budget 2048 / 128, measured", itl_gain["measured"], above=2)

# %% [markdown]
# The chats' gain is large and clear. The newcomer's cost is small: its prompt takes a few more
# steps, each carrying the chats' decodes too. That cost (about a sixth, predicted) is smaller than
# what this busy two-core machine drifts between two servers started minutes apart, so the
# measured ratio for one newcomer lands on either side of 1 from run to run (0.89 to 1.21 in our
# runs); only the prediction error is checked for it below.

# %% [markdown]
# Predicted against measured, for both `--max-num-seqs` settings:

# %%
if SMALL in measured and LARGE in measured:
    table = pd.concat({f"max_num_seqs={k}": compare(predicted[k], measured[k][0].trace) for k in (SMALL, LARGE)}, axis=1)
    display(table.round(3))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, figure, unit in ((axes[0], "output_tok_s", "output tokens/s"), (axes[1], "ttft_p50", "TTFT p50 (s)")):
        x = np.arange(2)
        for i, source in enumerate(("predicted", "measured")):
            ax.bar(x + 0.4 * i, [table[(f"max_num_seqs={k}", source)][figure] for k in (SMALL, LARGE)], 0.4, label=source)
        ax.set_xticks(x + 0.2, [f"max_num_seqs={k}" for k in (SMALL, LARGE)])
        ax.set(ylabel=unit)
        ax.legend()
    ratio = lambda src, figure: src[LARGE][figure] / src[SMALL][figure]
    meas = {k: load_figures(measured[k][0].trace) for k in (SMALL, LARGE)}
    pred = {k: load_figures(predicted[k]) for k in (SMALL, LARGE)}
    axes[0].set_title(f"128 seqs serve {ratio(meas, 'output_tok_s'):.1f}x the tokens/s (predicted {ratio(pred, 'output_tok_s'):.1f}x)")
    axes[1].set_title(f"and give the first token {1 / ratio(meas, 'ttft_p50'):.0f}x sooner (predicted {1 / ratio(pred, 'ttft_p50'):.0f}x)")
    axes[1].set_yscale("log")
    plt.tight_layout()
    plt.show()

# %% [markdown]
# ## Each knob's prediction error
#
# The ratios a tuner acts on (large setting over small, uncached over cached), predicted and
# measured. Each has a tolerance: how far prediction and measurement fell apart over repeated
# runs of this notebook on the course's 2-core VM, shared with other jobs (load 2-5), rounded up.
# An error beyond it is a finding about the simulator, not noise.

# %%
TOLERANCE = {"max_num_seqs 128/2: output tokens/s": 0.45, "max_num_seqs 2/128: TTFT p50": 0.5,
             "max_num_seqs 128/2: ITL p50": 0.45, "prefix caching off/on: TTFT p50": 0.35,
             "budget 2048/128: chats' ITL p99": 0.5, "budget 128/2048: newcomer's TTFT": 0.5}
if SMALL in measured and LARGE in measured and prefix_result and len(budget_meas) == 2:
    findings = pd.DataFrame({
        "predicted": [ratio(pred, "output_tok_s"), 1 / ratio(pred, "ttft_p50"), ratio(pred, "itl_p50"), predicted_gain,
                      itl_gain["predicted"], ttft_cost["predicted"]],
        "measured": [ratio(meas, "output_tok_s"), 1 / ratio(meas, "ttft_p50"), ratio(meas, "itl_p50"), measured_gain,
                     itl_gain["measured"], ttft_cost["measured"]]},
        index=list(TOLERANCE))
    findings["error"] = findings["predicted"] / findings["measured"] - 1
    findings["tolerance"] = pd.Series(TOLERANCE)
    findings["verdict"] = np.where(findings["error"].abs() <= findings["tolerance"], "within", "MISS: a finding")
    display(findings.round(3))
    expect("throughput gain of 128 over 2 sequences, measured", findings["measured"].iloc[0], above=1.5)
    expect("TTFT p50 of 2 over 128 sequences, measured", findings["measured"].iloc[1], above=5)
    for knob, row in findings.iterrows():
        expect(f"prediction error, {knob}", abs(row["error"]), below=row["tolerance"])
    small_itl = compare(predicted[SMALL], measured[SMALL][0].trace).loc["itl_p50"]
    print(f"ITL p50 with 2 sequences: predicted {small_itl['predicted'] * 1e3:.0f} ms, "
          f"measured {small_itl['measured'] * 1e3:.0f} ms")

# %% [markdown]
# What the errors say:
#
# - **Ratios measured side by side hold better than absolute figures.** The calibration, the two
#   servers' loads and the prefix runs happen minutes apart on a machine whose speed drifts (two
#   cores, shared), so each setting's absolute throughput and TTFT can be off by a fifth to a third;
#   a tuner's decision rests on the ratio, and so does the tolerance.
# - **Prefix caching and the token budget** are predicted best: a cached prompt computes only its
#   last, uncached tokens, and the simulator's paged cache with vLLM's block size reuses exactly
#   the blocks vLLM reuses (the hit counts above are the block rule's); a chunked prompt's steps
#   are mostly prompt tokens, which the calibration's lone prompts priced.
# - **`--max-num-seqs`** is right in direction and size to within its tolerance, and it needs the
#   loosest one. The cost model is linear in the number of sequences, but vLLM's decode step on
#   this CPU is not, from 1 to 4 sequences (the calibration's points above); where the line misses
#   at 2 sequences (the ITL p50 just printed), the small setting's throughput and its queue, hence
#   its TTFT, are mispredicted with it, in either direction.
#
# What this CPU cannot show: on a GPU a decode step is bound by reading the weights, so
# `--max-num-seqs` buys throughput almost for free up to the batch where compute takes over
# (notebook 09's roofline presets price it), and the TTFT cost of a long queue is the same
# arithmetic as here. Prefix caching saves prompt compute, which on a GPU is cheap per token, so
# its TTFT gain is smaller there for prompts this short, and larger for prompts of thousands of
# tokens.
#
# ## Summary
#
# - vLLM's scheduling flags are batchlab's knobs under other names; V1 turns prefix caching and
#   chunked prefill on by default, with a budget of 2,048 tokens per step and 128 sequences on a
#   CPU.
# - A server you can only reach over HTTP can still be calibrated: lone prompts price prefill,
#   concurrent decodes price the per-sequence decode, and the four-term cost model fits both.
# - At the same offered load, `--max-num-seqs 128` against `2` served several times the tokens per
#   second and gave the first token many times sooner; the queue it avoided shows in
#   `vllm:num_requests_waiting`. The simulator predicted every knob's ratios within their
#   tolerances; `--max-num-seqs` needs the loosest, because vLLM's decode step from 1 to 4
#   sequences does not follow the cost model's line.
# - `cache_salt` keeps a request out of the shared prefix cache on the same server; the shared
#   requests were served whole blocks from the cache, exactly as many tokens as the block rule says.
# - A smaller token budget (`--max-num-batched-tokens 128`) cut a long prompt into chunks: the
#   streaming chats' ITL p99 fell several times over. The newcomer's first token was predicted to
#   come about a sixth later, a cost this machine's drift between servers hides.
# - `/metrics` counters are differences of two scrapes; gauges are moments; a histogram's p99 is
#   within a bucket's width of the exact one, and vLLM's buckets are wide.

# %% [markdown]
# ## Exercises
#
# Worked solutions are in `solutions/13_tuning_vllm.py`.
#
# **13.1** Write `hit_tokens(prompt_len, shared_len, block_size)`: how many of a prompt's tokens
# vLLM's prefix cache serves when its first `shared_len` tokens were computed before, with blocks
# of `block_size` tokens. Check it against the 2,688 tokens measured above.

# %%
answer = None  # your code here
check("13.1", answer)

# %% [markdown]
# **13.2** Write `predicted_throughput(cost, requests, max_num_seqs)`: the output tokens per second
# the simulator predicts for a load at a given `--max-num-seqs`, vLLM's other defaults kept. Then
# predict `--max-num-seqs 8` for the load above, and, if you have a few minutes, measure it:
# `start(VLLMFlags(max_num_seqs=8))` and `measure(...)`.

# %%
answer = None  # your code here
check("13.2", answer)
