"""``python -m batchlab.loadgen``: load an OpenAI-compatible server and print what the client saw.

    python -m batchlab.loadgen --url http://127.0.0.1:8000 --num-requests 32 --rate 2
    python -m batchlab.loadgen --url http://127.0.0.1:8000 --arrival gamma --burstiness 0.25 --rate 2
    python -m batchlab.loadgen --url http://127.0.0.1:8000 --workload data/chat_poisson_cpu.jsonl
    python -m batchlab.loadgen --url http://127.0.0.1:8000 --concurrency 8 --num-requests 32   # closed loop
    python -m batchlab.loadgen --url http://127.0.0.1:8000 --rates 1,2,4 --goodput ttft:500 tpot:100 --out runs/
    python -m batchlab.loadgen --url http://my-vllm:8000 --endpoint chat --prompts my_prompts.jsonl \\
        --tokenizer HuggingFaceTB/SmolLM2-135M-Instruct --rate 4 --max-concurrency 16 --warmup 2

Prompts: the course corpus (token ids from ``--tokenizer``, default the course's; as text with
``--text`` or ``--endpoint chat``), or a JSONL file of ``{"prompt": ...}`` / ``{"messages": ...}``
lines (``--prompts``). Bad options stop with one line naming the value and what is allowed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from batchlab.checks import check_int, check_number


def parse_args(argv=None) -> argparse.Namespace:
    from batchlab.workloads import ARRIVALS
    p = argparse.ArgumentParser(prog="python -m batchlab.loadgen", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model id (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--endpoint", default="completions", help="completions or chat")
    p.add_argument("--prompts", default=None, help="a JSONL file of {\"prompt\": ...} or {\"messages\": ...} lines")
    p.add_argument("--tokenizer", default="course",
                   help="counts prompt tokens: 'course' (the course's model) or a tokenizer folder or hub name")
    p.add_argument("--text", action="store_true", help="send corpus prompts as text, not token ids")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--arrival", choices=ARRIVALS, default="poisson", help="open loop: the arrival process")
    p.add_argument("--rate", type=float, default=2.0, help="open loop: requests per second")
    p.add_argument("--rates", default=None, help="a sweep: comma-separated rates, one load each (e.g. 1,2,4)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma: shape (1 = Poisson, < 1 burstier)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workload", default=None, help="replay a workload file's requests and arrival times")
    p.add_argument("--concurrency", type=int, default=None, help="closed loop with this many users")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="open loop: at most this many requests in flight (later ones wait to be sent)")
    p.add_argument("--warmup", type=int, default=0, help="requests sent first and left out of the results")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--sampling-seed", type=int, default=None, help="the requests' seed field")
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="exactly max_tokens per request (--no-ignore-eos: stop at the end of sequence)")
    p.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                   help="SLOs in milliseconds, vLLM's form: ttft:500 tpot:50 e2el:4000")
    p.add_argument("--slo-target", type=float, default=0.9,
                   help="--rates: the share of requests that must meet the SLO (DistServe's goodput)")
    p.add_argument("--request-timeout", type=float, default=300.0, help="seconds before one request gives up")
    p.add_argument("--max-duration", type=float, default=600.0, help="seconds before a load is cut off")
    p.add_argument("--out", default=None, help="a folder for summary.json and requests.csv (--rates: a folder per "
                                                 "rate, and sweep.csv)")
    p.add_argument("--save-trace", default=None, help="write the client-side trace (batchlab JSON) here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def _tokenizer(name: str):
    from batchlab.loadgen import course_tokenizer
    if name == "course":
        return course_tokenizer()
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as e:
        raise ValueError(f"tokenizer={name!r}; must be 'course', a tokenizer folder or a hub name that loads "
                         f"({type(e).__name__})") from None


def check_args(args: argparse.Namespace) -> None:
    """Every option's value, before anything is sent (ValueError: ``name=value; must ...``)."""
    from batchlab.loadgen import ENDPOINTS
    if args.endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint={args.endpoint!r}; must be one of {list(ENDPOINTS)}")
    for name in ("num_requests", "prompt_len", "output_len"):
        check_int(name.replace("_", "-"), getattr(args, name))
    check_int("concurrency", args.concurrency, allow_none=True)
    check_int("max-concurrency", args.max_concurrency, allow_none=True)
    check_int("warmup", args.warmup, 0)
    check_number("rate", args.rate, 0, strict=True)
    check_number("request-timeout", args.request_timeout, 0, strict=True)
    check_number("max-duration", args.max_duration, 0, strict=True)
    if not 0 < args.slo_target <= 1:
        raise ValueError(f"slo-target={args.slo_target!r}; must be a share of requests in (0, 1], e.g. 0.9")
    if args.concurrency is not None and (args.rates or args.max_concurrency):
        raise ValueError(f"concurrency={args.concurrency}; must not be combined with --rates or --max-concurrency "
                         "(a closed loop has no rate: use --max-concurrency with a rate instead)")
    if args.prompts and args.workload:
        raise ValueError(f"prompts={args.prompts!r}; must not be combined with --workload (pick one source)")


def make_requests_for(args: argparse.Namespace, tok):
    """rate -> the load's requests (the same prompts at every rate; arrivals follow the rate)."""
    from batchlab.loadgen import plan_requests, replay_requests
    from batchlab.loadgen.prompts import as_text, read_prompts, with_arrivals
    closed = args.concurrency is not None
    arrival = "at_once" if closed else args.arrival
    burst = args.burstiness if arrival == "gamma" else 1.0
    if args.prompts:
        prompts = read_prompts(args.prompts, args.output_len, tok)
        return lambda rate: with_arrivals(prompts, args.num_requests, arrival, None if closed else rate, burst,
                                          args.seed)
    if args.workload:
        if args.rates:
            raise ValueError(f"workload={args.workload!r}; must not be combined with --rates (a workload file "
                             "has its own arrival times)")
        reqs = replay_requests(args.workload, tok)
        return lambda rate: as_text(reqs, tok) if args.text or args.endpoint == "chat" else reqs

    def corpus(rate):
        reqs = plan_requests(args.num_requests, args.prompt_len, args.output_len, tok, arrival,
                             None if closed else rate, burst, args.seed)
        return as_text(reqs, tok) if args.text or args.endpoint == "chat" else reqs
    return corpus


def _print_result(result, slo) -> None:
    print(result.summary())
    with pd.option_context("display.width", 140, "display.float_format", "{:.4f}".format):
        try:
            print(result.table())
        except ValueError as e:
            print(f"no latency table: {e}")
    if slo is not None:
        try:
            print(f"goodput (vLLM's: requests meeting {slo} per second): {result.goodput(slo):.3f} req/s")
        except ValueError as e:
            print(f"no goodput: {e}")


def save_result(result, out: Path, slo) -> None:
    """``summary.json`` (outcomes, rates, the latency table, goodput) and ``requests.csv`` (one row
    per request) in the folder ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    summary = {"url": result.url, "model": result.model, "mode": result.mode, "target_rate": result.target_rate,
               "max_concurrency": result.max_concurrency, "concurrency": result.concurrency,
               "wall_seconds": result.wall_seconds, "outcomes": result.status_counts(), "cut": result.cut,
               "warmup": {"num_requests": len(result.warmup), "num_ok": sum(r.ok for r in result.warmup)},
               "rate_report": result.rate_report()}
    try:
        table = result.table()
        summary["latency_s"] = json.loads(table.to_json(orient="index"))
        summary["throughput"] = {k: float(v) for k, v in table.attrs["throughput"].items()}
        if slo is not None:
            summary["slo_s"] = {k: v for k, v in vars(slo).items() if v is not None}
            summary["goodput"] = result.goodput(slo)
    except ValueError as e:
        summary["latency_s"] = None
        summary["no_latency_because"] = str(e)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    result.requests_df().to_csv(out / "requests.csv", index=False)


def run(args: argparse.Namespace) -> int:
    from batchlab.loadgen import run_load
    from batchlab.loadgen.sweep import parse_goodput, parse_rates, rate_sweep
    check_args(args)
    rates = parse_rates(args.rates) if args.rates else None
    slo = parse_goodput(args.goodput) if args.goodput else None
    tok = _tokenizer(args.tokenizer)
    make_requests = make_requests_for(args, tok)
    closed = args.concurrency is not None
    extra = {k: v for k, v in (("top_p", args.top_p), ("seed", args.sampling_seed)) if v is not None}
    load_kwargs = dict(model=args.model, api_key=args.api_key, endpoint=args.endpoint, temperature=args.temperature,
                       ignore_eos=args.ignore_eos, request_timeout=args.request_timeout,
                       max_duration=args.max_duration, extra_body=extra, warmup=args.warmup,
                       progress=not args.no_progress, tokenizer=tok)
    out = Path(args.out) if args.out else None
    if rates:
        def each(rate, result):
            print(f"\n--- rate {rate:g}/s")
            _print_result(result, slo)
            if out is not None:
                save_result(result, out / f"rate_{rate:g}", slo)
        sweep, best = rate_sweep(args.url, make_requests, rates, slo, args.slo_target, on_result=each,
                                 max_concurrency=args.max_concurrency, **load_kwargs)
        columns = [c for c in ("rate", "achieved_rate", "num_finished", "request_throughput", "ttft_p50",
                               "ttft_p99", "tpot_p50", "goodput", "slo_attainment", "cut") if c in sweep]
        print("\n" + sweep[columns].to_string(index=False, float_format="{:.3f}".format))
        if best is not None:
            if best == float("inf"):
                answer = f"above the sweep (every rate met it; try rates over {max(rates):g})"
            elif best != best:                   # NaN
                answer = f"below the sweep (even {min(rates):g}/s missed it; try lower rates)"
            else:
                answer = f"{best:.3f} req/s"
            print(f"DistServe's goodput: the highest rate at which {args.slo_target:.0%} of requests met {slo}: "
                  f"{answer}")
        if out is not None:
            sweep.to_csv(out / "sweep.csv", index=False)
        return 0 if all(o == {"ok": n} for o, n in zip(sweep["outcomes"], sweep["num_requests"])) else 1
    result = run_load(args.url, make_requests(args.rate), mode="closed" if closed else "open",
                      concurrency=args.concurrency, target_rate=None if closed else args.rate,
                      max_concurrency=args.max_concurrency, **load_kwargs)
    _print_result(result, slo)
    if out is not None:
        save_result(result, out, slo)
        print(f"saved {out / 'summary.json'} and {out / 'requests.csv'}")
    if args.save_trace:
        from batchlab.analysis.trace_io import save_trace
        print("trace saved to", save_trace(result.trace, args.save_trace))
    return 0 if all(r.ok for r in result.records) else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except ValueError as e:
        print(f"batchlab.loadgen: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
