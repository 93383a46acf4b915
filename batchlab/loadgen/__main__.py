"""``python -m batchlab.loadgen``: load an OpenAI-compatible server and print what the client saw.

    python -m batchlab.loadgen --url http://127.0.0.1:8000 --num-requests 32 --rate 2
    python -m batchlab.loadgen --url http://127.0.0.1:8000 --arrival gamma --burstiness 0.25 --rate 2
    python -m batchlab.loadgen --url http://127.0.0.1:8000 --workload data/chat_poisson_cpu.jsonl
    python -m batchlab.loadgen --url http://127.0.0.1:8000 --concurrency 8 --num-requests 32   # closed loop

Prompts are token ids from the course's tokenizer (corpus text), sent to /v1/completions.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd


def parse_args(argv=None) -> argparse.Namespace:
    from batchlab.workloads import ARRIVALS
    p = argparse.ArgumentParser(prog="python -m batchlab.loadgen", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model id (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--arrival", choices=ARRIVALS, default="poisson", help="open loop: the arrival process")
    p.add_argument("--rate", type=float, default=2.0, help="open loop: requests per second")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma: shape (1 = Poisson, < 1 burstier)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workload", default=None, help="replay a workload file's requests and arrival times")
    p.add_argument("--concurrency", type=int, default=None, help="closed loop with this many users")
    p.add_argument("--max-duration", type=float, default=600.0, help="seconds before the load is cut off")
    p.add_argument("--save-trace", default=None, help="write the client-side trace (batchlab JSON) here")
    return p.parse_args(argv)


def main(argv=None) -> int:
    from batchlab.loadgen import course_tokenizer, plan_requests, replay_requests, run_load
    args = parse_args(argv)
    tok = course_tokenizer()
    closed = args.concurrency is not None
    if args.workload:
        reqs = replay_requests(args.workload, tok)
        rate = None
    else:
        arrival = "at_once" if closed else args.arrival
        reqs = plan_requests(args.num_requests, args.prompt_len, args.output_len, tok, arrival,
                             None if arrival == "at_once" else args.rate,
                             args.burstiness if arrival == "gamma" else 1.0, args.seed)
        rate = None if closed else args.rate
    result = run_load(args.url, reqs, mode="closed" if closed else "open", concurrency=args.concurrency,
                      model=args.model, api_key=args.api_key, max_duration=args.max_duration, target_rate=rate)
    print(result.summary())
    with pd.option_context("display.width", 140, "display.float_format", "{:.4f}".format):
        try:
            print(result.table())
        except ValueError as e:
            print(f"no latency table: {e}")
    if args.save_trace:
        from batchlab.analysis.trace_io import save_trace
        print("trace saved to", save_trace(result.trace, args.save_trace))
    return 0 if all(r.ok for r in result.records) else 1


if __name__ == "__main__":
    sys.exit(main())
