"""Soak batchlab's server: 20,000 short mixed requests over loopback, and its memory.

    .venv/bin/python scripts/soak_server.py                      # 20,000 requests (several minutes)
    .venv/bin/python scripts/soak_server.py --num-requests 2000 --trace-window 500

Starts ``python -m batchlab.serve`` in a subprocess, sends ``--warmup`` requests, reads the
server's resident memory (VmRSS in /proc, after an idle pause long enough for the server's
periodic ``malloc_trim``), sends the rest (``batchlab.loadgen.soak``: streamed and
whole completions, chats, mid-stream disconnects, bad requests), reads it again, and checks:
memory growth under 50 MB, every accepted request answered, the KV cache empty at the end, and
``/metrics`` counting every request the server finished or aborted. Exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchlab.loadgen.prom import scrape, value             # noqa: E402
from batchlab.loadgen.soak import soak                      # noqa: E402
from batchlab.launch import start_server                 # noqa: E402
from batchlab.serve.memory import TRIM_INTERVAL_S, rss_mb   # noqa: E402

GROWTH_LIMIT_MB = 50.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=20_000)
    p.add_argument("--warmup", type=int, default=2_000, help="requests before the first memory reading")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    p.add_argument("--trace-window", type=int, default=None, help="the server's --trace-window (its default if unset)")
    args = p.parse_args(argv)
    knobs = {"trace_window": args.trace_window} if args.trace_window else {}
    server = start_server(max_num_seqs=32, max_model_len=128, threads=args.threads, **knobs)
    ok = True
    try:
        pid = server.proc.pid
        t0 = time.perf_counter()
        warm = soak(server.url, args.warmup, args.concurrency, seed=1)
        time.sleep(TRIM_INTERVAL_S + 1)           # idle long enough for the server's periodic trim
        rss_warm = rss_mb(pid)
        print(f"warm-up: {args.warmup} requests in {time.perf_counter() - t0:.0f} s; server RSS {rss_warm:.1f} MB",
              flush=True)
        rest = args.num_requests - args.warmup
        t1 = time.perf_counter()
        marks = {rest * k // 4 for k in range(1, 4)}

        def progress(done: int) -> None:
            if done in marks:
                print(f"  {done}/{rest} requests, {time.perf_counter() - t1:.0f} s, RSS {rss_mb(pid):.1f} MB",
                      flush=True)

        report = soak(server.url, rest, args.concurrency, seed=2, on_progress=progress)
        seconds = time.perf_counter() - t1
        time.sleep(TRIM_INTERVAL_S + 1)
        rss_end = rss_mb(pid)
        stats = httpx.get(f"{server.url}/batchlab/stats", timeout=10).json()
        metrics = scrape(server.url)
        print(f"soak: {rest} requests in {seconds:.0f} s ({rest / seconds:.1f}/s); outcomes "
              f"{dict(sorted(report.outcomes.items()))}")
        growth = rss_end - rss_warm
        print(f"server RSS: {rss_warm:.1f} MB after warm-up, {rss_end:.1f} MB at the end: growth {growth:+.1f} MB "
              f"(limit {GROWTH_LIMIT_MB:.0f} MB)")
        print(f"server stats: in flight {stats['in_flight']}, KV used {stats['kv_used_tokens']} tokens, "
              f"trace keeps {stats['trace_window']} (forgot {stats['trace_forgotten']}), accepted {stats['accepted']}")
        ended = value(metrics, "vllm:request_success")
        accepted = report.num_accepted + warm.num_accepted
        print(f"/metrics: {ended:.0f} requests ended (finished or aborted); the clients had {accepted} accepted")
        checks = {
            f"memory growth {growth:.1f} MB < {GROWTH_LIMIT_MB:.0f} MB": growth < GROWTH_LIMIT_MB,
            f"every accepted request answered ({len(report.failures) + len(warm.failures)} failures)":
                not report.failures and not warm.failures,
            "the KV cache is empty and nothing is in flight": stats["kv_used_tokens"] == 0 and stats["in_flight"] == 0,
            "/metrics counted every accepted request": ended == accepted == stats["accepted"],
        }
        for failure in (report.failures + warm.failures)[:10]:
            print("  failure:", failure)
        for what, passed in checks.items():
            print(("ok    " if passed else "FAILED"), what)
        ok = all(checks.values())
    finally:
        server.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
