"""Client and server overhead of batchlab's HTTP server, on the real model.

One workload (32 requests of 64 prompt tokens and 32 output tokens, all sent at once, greedy,
exact lengths) is served, alternately, by

- the engine in this process (``Engine.run`` on the wall clock, continuous batching, 32 slots),
- batchlab's server in a subprocess (``start_server``, the same scheduler and cache), loaded by
  ``batchlab.loadgen`` with 32 concurrent streams,

``--rounds`` times each (ABAB...), so that the machine's drift shows in the spread. Printed per
round and as medians:

- client TTFT p50 minus the server-side engine's own TTFT p50 *for the same requests* (from the
  ``batchlab`` extension field): what HTTP, tokenizing, detokenizing and the event loop add;
- client TTFT p50 minus the in-process engine's TTFT p50 (the same requests served without HTTP;
  this also includes how the requests trickle in over HTTP, so the first step starts with fewer);
- server output throughput / in-process output throughput.

Goals: the first difference <= 10 ms; the throughput ratio >= 0.9.

Two more measurements, chosen with ``--measure``:

- ``metrics``: what scraping ``/metrics`` once a second costs. 64 streams (32 prompt + 32 output
  tokens) are served with and without a scraper (a process of its own, as Prometheus would be),
  alternately, ``--rounds`` times each; printed:
  the throughput ratio per pair (goal: the scraped runs keep >= 98%), and the exposition's own
  time per scrape and the engine thread's time per token spent on the metrics.
- ``detokenizer``: the server's incremental detokenizer, per token, at outputs of 64 and 1,024
  tokens (with a stop string held back), beside decoding the whole output at every token.

    .venv/bin/python benchmarks/bench_server.py [--rounds 2] [--threads N]
    .venv/bin/python benchmarks/bench_server.py --measure metrics --rounds 3 --threads 1
    .venv/bin/python benchmarks/bench_server.py --measure detokenizer
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import numpy as np

from batchlab.analysis import metrics
from batchlab.backends import ModelBackend
from batchlab.engine import Engine
from batchlab.loadgen import from_workload, run_load
from batchlab.model import load_model
from batchlab.schedulers import ContinuousBatcher
from batchlab.launch import start_server
from batchlab.workloads import make_workload

N, PROMPT_LEN, OUTPUT_LEN = 32, 64, 32
SLOTS, MAX_MODEL_LEN, MAX_BATCHED_TOKENS = 32, 256, 512


def in_process(lm, workload) -> dict:
    engine = Engine(ContinuousBatcher(max_num_seqs=SLOTS, max_num_batched_tokens=MAX_BATCHED_TOKENS),
                    ModelBackend(lm, num_slots=SLOTS, max_seq_len=MAX_MODEL_LEN), clock="wall")
    trace = engine.run(workload)
    row = metrics.summary_row(trace, percentiles=(50,))
    return {"ttft_p50": row["ttft_p50"], "output_throughput": row["output_throughput"],
            "outputs": {r.request_id: r.output_ids for r in trace.requests}}


def over_http(url: str, workload) -> dict:
    result = run_load(url, from_workload(workload), mode="closed", concurrency=N, max_duration=600)
    if not all(r.ok for r in result.records):
        raise RuntimeError(f"not every request finished: {result.status_counts()}")
    client = metrics.summary_row(result.trace, percentiles=(50,))
    engine = metrics.per_request_metrics(result.server_trace())
    # Where the client's extra time goes, per request (unix times; one machine, one clock):
    # sending (connect, write, wait in the server's event loop until the handler runs), the
    # handler (parse, tokenize, hand to the engine), and the first token's way back out.
    parts = {"send_to_handler": [], "handler_to_engine": [], "first_token_out": []}
    for r in result.records:
        s, t0 = r.server, r.client_t0_unix
        offset = s["engine_clock_unix_offset"]
        parts["send_to_handler"].append(s["received_unix"] - (t0 + r.send_time))
        parts["handler_to_engine"].append(s["arrival_time"] + offset - s["received_unix"])
        parts["first_token_out"].append(t0 + r.chunk_times[0] - (s["first_token_time"] + offset))
    return {"ttft_p50": client["ttft_p50"], "engine_ttft_p50": float(engine["ttft"].median()),
            **{k: float(np.median(v)) * 1e3 for k, v in parts.items()},
            "output_throughput": client["output_throughput"],
            "outputs": {r.request_id: r.server["token_ids"] for r in result.records}}


# --- /metrics: what a scrape a second costs ----------------------------------------------------------
METRICS_STREAMS, METRICS_PROMPT, METRICS_OUTPUT = 64, 32, 32


# A scraper in a process of its own, as Prometheus is: GET /metrics once a second, a line per scrape.
SCRAPER = ("import sys, time, httpx\n"
           "with httpx.Client(timeout=10) as c:\n"
           "    while True:\n"
           "        c.get(sys.argv[1] + '/metrics').raise_for_status()\n"
           "        print('scraped', flush=True)\n"
           "        time.sleep(1.0)\n")


def scraped_load(url: str, workload, scrape: bool) -> tuple[float, int]:
    """(output tokens/s, scrapes made) of one 64-stream load, with a 1 Hz scraper or without."""
    scraper = None
    if scrape:
        scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, url], stdout=subprocess.PIPE, text=True)
        scraper.stdout.readline()                   # started and scraped once before the load begins
    try:
        result = run_load(url, from_workload(workload), mode="closed", concurrency=METRICS_STREAMS, max_duration=900)
    finally:
        scrapes = 0
        if scraper is not None:
            scraper.terminate()
            scrapes = len(scraper.communicate()[0].splitlines())
    if not all(r.ok for r in result.records):
        raise RuntimeError(f"not every request finished: {result.status_counts()}")
    return float(metrics.throughput(result.trace)["output_throughput"]), scrapes


def exposition_costs(lm) -> tuple[float, float]:
    """(ms per /metrics exposition with every histogram filled, µs per token of the engine thread's
    metric updates), timed in this process on a ServerMetrics like the server's."""
    from batchlab.serve.engine_view import EngineStats
    from batchlab.serve.metrics import ServerMetrics
    m = ServerMetrics("m", 1024, lambda: EngineStats(8, 2, 100, 1000, 0))
    t = time.perf_counter()
    for i in range(10_000):
        m.token(32, 0.0, 0.05 + i * 1e-4, None if i % 64 == 0 else 0.04 + i * 1e-4, True, False)
    per_token_us = (time.perf_counter() - t) / 10_000 * 1e6
    t = time.perf_counter()
    for _ in range(200):
        m.exposition()
    return (time.perf_counter() - t) / 200 * 1e3, per_token_us


def measure_metrics(args, lm) -> None:
    workload = make_workload(METRICS_STREAMS, prompt_len=METRICS_PROMPT, output_len=METRICS_OUTPUT,
                             arrival="at_once", seed=13, tokenizer=lm.tokenizer)
    server = start_server(policy="continuous", max_num_seqs=METRICS_STREAMS, max_model_len=256,
                          max_num_batched_tokens=MAX_BATCHED_TOKENS, threads=args.threads)
    ratios = []
    try:
        scraped_load(server.url, workload[:8], scrape=True)           # warm-up
        for i in range(args.rounds):
            order = (False, True) if i % 2 == 0 else (True, False)   # alternate which goes first
            runs = {scrape: scraped_load(server.url, workload, scrape) for scrape in order}
            (plain, _), (scraped, n) = runs[False], runs[True]
            ratios.append(scraped / plain)
            print(f"round {i + 1}: without scraping {plain:.1f} tok/s, scraped ({n} scrapes) {scraped:.1f} tok/s: "
                  f"ratio {ratios[-1]:.3f}", flush=True)
    finally:
        server.stop()
    per_scrape_ms, per_token_us = exposition_costs(lm)
    print(f"\n/metrics scraped once a second, {METRICS_STREAMS} streams: throughput ratio scraped / not scraped "
          f"median {statistics.median(ratios):.3f} (range {min(ratios):.3f} to {max(ratios):.3f}; goal >= 0.98)")
    print(f"  one exposition: {per_scrape_ms:.2f} ms of the event loop (a scrape a second: "
          f"{per_scrape_ms / 10:.3f}% of one core); metric updates on the engine thread: {per_token_us:.1f} µs "
          "per token")


# --- the detokenizer: per-token cost against output length --------------------------------------------
def measure_detokenizer(lm) -> None:
    from batchlab.serve.detok import Detokenizer
    from batchlab.workloads import CORPUS_PATH
    tok = lm.tokenizer
    ids = tok(CORPUS_PATH.read_text()[:20_000], add_special_tokens=False)["input_ids"][:1024]
    assert len(ids) == 1024, "the corpus is shorter than 1,024 tokens"

    def incremental(n: int) -> float:
        d = Detokenizer(tok, ["<never appears>"])
        t = time.perf_counter()
        for token in ids[:n]:
            d.add(token)
        d.flush()
        return (time.perf_counter() - t) / n * 1e6

    def whole_each_token(n: int) -> float:             # what the server did before: decode all again
        t = time.perf_counter()
        for k in range(1, n + 1):
            tok.decode(ids[:k], skip_special_tokens=True)
        return (time.perf_counter() - t) / n * 1e6

    print("µs per token (the fastest of 9 runs: on a shared machine, noise only adds):")
    for n in (64, 1024):
        inc = min(incremental(n) for _ in range(9))
        whole = min(whole_each_token(n) for _ in range(9))
        print(f"  {n:5d} tokens: incremental {inc:6.1f} µs, whole output decoded again per token {whole:7.1f} µs")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch threads, both sides (default: all cores)")
    p.add_argument("--measure", choices=("overhead", "metrics", "detokenizer"), default="overhead")
    args = p.parse_args()
    lm = load_model(threads=args.threads)
    if args.measure == "metrics":
        return measure_metrics(args, lm)
    if args.measure == "detokenizer":
        return measure_detokenizer(lm)
    workload = make_workload(N, prompt_len=PROMPT_LEN, output_len=OUTPUT_LEN, arrival="at_once", seed=12,
                             tokenizer=lm.tokenizer)
    server = start_server(policy="continuous", max_num_seqs=SLOTS, max_model_len=MAX_MODEL_LEN,
                          max_num_batched_tokens=MAX_BATCHED_TOKENS, threads=args.threads)
    try:
        over_http(server.url, workload[:4])          # warm-up: first steps, HTTP connections
        in_process(lm, workload[:4])
        rows = []
        for i in range(args.rounds):
            a = in_process(lm, workload)
            b = over_http(server.url, workload)
            if a["outputs"] != b["outputs"]:
                raise RuntimeError("the server's greedy outputs differ from the in-process engine's")
            rows.append({"overhead_ms": (b["ttft_p50"] - b["engine_ttft_p50"]) * 1e3,
                         "vs_in_process_ms": (b["ttft_p50"] - a["ttft_p50"]) * 1e3,
                         "throughput_ratio": b["output_throughput"] / a["output_throughput"],
                         "in_process_ttft_p50_ms": a["ttft_p50"] * 1e3, "client_ttft_p50_ms": b["ttft_p50"] * 1e3,
                         "server_engine_ttft_p50_ms": b["engine_ttft_p50"] * 1e3,
                         "in_process_tok_s": a["output_throughput"], "server_tok_s": b["output_throughput"],
                         "send_to_handler_ms": b["send_to_handler"], "handler_to_engine_ms": b["handler_to_engine"],
                         "first_token_out_ms": b["first_token_out"]})
            r = rows[-1]
            print(f"round {i + 1}: in-process TTFT p50 {r['in_process_ttft_p50_ms']:.1f} ms, "
                  f"{r['in_process_tok_s']:.1f} tok/s | server: client TTFT p50 {r['client_ttft_p50_ms']:.1f} ms, "
                  f"its engine's {r['server_engine_ttft_p50_ms']:.1f} ms, {r['server_tok_s']:.1f} tok/s; medians: send to "
                  f"handler {r['send_to_handler_ms']:.1f} ms, handler to engine {r['handler_to_engine_ms']:.1f} ms, "
                  f"first token out {r['first_token_out_ms']:.1f} ms", flush=True)
    finally:
        server.stop()
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    spread = {k: (min(r[k] for r in rows), max(r[k] for r in rows)) for k in rows[0]}
    print(f"\n{N} concurrent streams, {PROMPT_LEN} prompt + {OUTPUT_LEN} output tokens, {args.rounds} rounds "
          f"(greedy outputs identical in every round):")
    print(f"  client TTFT p50 - the server's engine TTFT p50 (same requests): {med['overhead_ms']:.1f} ms "
          f"(range {spread['overhead_ms'][0]:.1f} to {spread['overhead_ms'][1]:.1f}; goal <= 10 ms)")
    print(f"  client TTFT p50 - in-process engine TTFT p50:                  {med['vs_in_process_ms']:.1f} ms "
          f"(range {spread['vs_in_process_ms'][0]:.1f} to {spread['vs_in_process_ms'][1]:.1f})")
    print(f"  of which (medians per request): send to handler {med['send_to_handler_ms']:.1f} ms, handler to "
          f"engine {med['handler_to_engine_ms']:.1f} ms, engine's first token to the client {med['first_token_out_ms']:.1f} ms")
    print(f"  server / in-process output throughput:                         {med['throughput_ratio']:.3f} "
          f"(range {spread['throughput_ratio'][0]:.3f} to {spread['throughput_ratio'][1]:.3f}; goal >= 0.9)")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s)")
