"""``python -m batchlab.loadgen``: ``vllm bench serve``'s sibling: load an OpenAI-compatible
server, print what the client saw.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from datetime import datetime
from pathlib import Path

from batchlab.checks import check_int, check_number, fail

ENDPOINT_PATHS = {"/v1/completions": "completions", "/v1/chat/completions": "chat",
                  "completions": "completions", "chat": "chat"}
BACKENDS = ("openai", "openai-chat", "vllm")


def parse_args(argv=None) -> argparse.Namespace:
    from batchlab.workloads import ARRIVALS
    p = argparse.ArgumentParser(prog="python -m batchlab.loadgen",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("server")
    g.add_argument("--base-url", "--url", dest="base_url", default=None,
                   help="the server, e.g. http://127.0.0.1:8000 (default: http://HOST:PORT)")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--backend", default="openai",
                   help=f"one of {list(BACKENDS)} (openai-chat: the chat endpoint)")
    g.add_argument("--endpoint", default=None,
                   help="/v1/completions or /v1/chat/completions (default: by --backend)")
    g.add_argument("--header", nargs="*", default=None, metavar="KEY=VALUE",
                   help="HTTP headers for every request")
    g.add_argument("--model", default=None, help="model id (default: the first of /v1/models)")
    g.add_argument("--api-key", default=None,
                   help="default: $OPENAI_API_KEY, as vLLM's client reads it")
    g.add_argument("--tokenizer", default="course",
                   help="counts tokens: 'course' (the course's model) or a tokenizer folder or "
                        "hub name")
    g.add_argument("--label", default=None,
                   help="the result's label and file-name prefix (default: --backend)")
    d = p.add_argument_group("dataset (vLLM's)")
    d.add_argument("--dataset-name", default=None,
                   help="random (the default), sharegpt or prefix_repetition")
    d.add_argument("--dataset-path", default=None,
                   help="--dataset-name sharegpt: a ShareGPT-style JSON file")
    d.add_argument("--num-prompts", "--num-requests", dest="num_prompts", type=int, default=32)
    d.add_argument("--input-len", "--prompt-len", dest="input_len", type=int, default=None,
                   help="sets --random-input-len")
    d.add_argument("--output-len", type=int, default=None,
                   help="sets every dataset's output length")
    d.add_argument("--random-input-len", type=int, default=64)
    d.add_argument("--random-output-len", type=int, default=16)
    d.add_argument("--random-range-ratio", default="0.0",
                   help='lengths drawn from [len * (1 - r), len * (1 + r)]; or '
                        '{"input": r1, "output": r2}')
    d.add_argument("--random-prefix-len", type=int, default=0,
                   help="tokens shared by every random prompt")
    d.add_argument("--sharegpt-output-len", type=int, default=None,
                   help="default: each answer's length")
    d.add_argument("--prefix-repetition-prefix-len", type=int, default=256)
    d.add_argument("--prefix-repetition-suffix-len", type=int, default=256)
    d.add_argument("--prefix-repetition-num-prefixes", type=int, default=10)
    d.add_argument("--prefix-repetition-output-len", type=int, default=128)
    d.add_argument("--disable-shuffle", action="store_true")
    d.add_argument("--no-oversample", action="store_true")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--prompts", default=None,
                   help="the course's: a JSONL file of {\"prompt\": ...} or "
                                                   "{\"messages\": ...} lines")
    d.add_argument("--workload", default=None,
                   help="the course's: replay a workload file's requests and arrivals")
    d.add_argument("--text", action="store_true", help="send token-id prompts as text")
    t = p.add_argument_group("traffic")
    t.add_argument("--request-rate", "--rate", dest="request_rate", type=float, default=math.inf,
                   help="requests per second (inf: all at once)")
    t.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape: 1 = Poisson, < 1 burstier, inf fixed")
    t.add_argument("--ramp-up-strategy", default=None,
                   help="linear or exponential, from --ramp-up-start-rps "
                                                            "to --ramp-up-end-rps")
    t.add_argument("--ramp-up-start-rps", type=float, default=None)
    t.add_argument("--ramp-up-end-rps", type=float, default=None)
    t.add_argument("--max-concurrency", type=int, default=None,
                   help="at most this many requests in flight (later ones wait to be sent)")
    t.add_argument("--num-warmups", "--warmup", dest="num_warmups", type=int, default=0,
                   help="requests sent first and left out of the results")
    t.add_argument("--arrival", choices=ARRIVALS, default=None,
                   help="old form: poisson (--burstiness 1), gamma, fixed (--burstiness inf), "
                        "at_once (rate inf)")
    t.add_argument("--concurrency", type=int, default=None,
                   help="the course's: a closed loop with this many users")
    t.add_argument("--rates", default=None,
                   help="the course's: a sweep, one load per rate (e.g. 1,2,4)")
    s = p.add_argument_group("sampling")
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--top-p", type=float, default=None)
    s.add_argument("--top-k", type=int, default=None)
    s.add_argument("--min-p", type=float, default=None)
    s.add_argument("--sampling-seed", type=int, default=None, help="the requests' seed field")
    s.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=None,
                   help="send ignore_eos (default: with --dataset-name random and --workload, "
                        "as vLLM does)")
    s.add_argument("--continuous-usage-stats", action="store_true",
                   help="ask for usage in every chunk (vLLM's and batchlab's extension)")
    s.add_argument("--extra-body", default=None,
                   help="a JSON object merged into every request body")
    r = p.add_argument_group("results")
    r.add_argument("--percentile-metrics", default="ttft,tpot,itl",
                   help="of ttft, tpot, itl, e2el, client_queue_time, e2el_including_client_queue")
    r.add_argument("--metric-percentiles", default="99", help="e.g. 50,90,99")
    r.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                   help="SLOs in milliseconds, vLLM's form: ttft:500 tpot:50 e2el:4000")
    r.add_argument("--slo-target", type=float, default=0.9,
                   help="--rates: the share of requests that must meet the SLO "
                        "(DistServe's goodput)")
    r.add_argument("--save-result", action="store_true",
                   help="write vllm bench serve's result JSON")
    r.add_argument("--save-detailed", action="store_true",
                   help="with per-request lists (ttfts, itls, ...)")
    r.add_argument("--result-dir", default=None)
    r.add_argument("--result-filename", default=None,
                   help="default: {label}-{rate}qps[-concurrency{N}]-{model}-{date}.json")
    r.add_argument("--out", default=None, help="old form of --save-result --result-dir DIR")
    r.add_argument("--save-trace", default=None,
                   help="write the client-side trace (batchlab JSON) here")
    r.add_argument("--disable-tqdm", "--no-progress", dest="disable_tqdm", action="store_true")
    r.add_argument("--request-timeout", type=float, default=300.0,
                   help="seconds before one request gives up")
    r.add_argument("--max-duration", type=float, default=600.0,
                   help="seconds before a load is cut off")
    return p.parse_args(argv)


def _tokenizer(name: str):
    from batchlab.loadgen import course_tokenizer
    if name == "course":
        return course_tokenizer()
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as e:
        raise ValueError(f"tokenizer={name!r}; must be 'course', a tokenizer folder or a hub "
                         f"name that loads ({type(e).__name__})") from None


def parse_headers(items: list[str] | None) -> dict[str, str]:
    """``--header KEY=VALUE ...`` as a dict (vLLM's form)."""
    headers = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            fail("header", item, "KEY=VALUE", "e.g. --header x-team=course")
        headers[key.strip()] = value.strip()
    return headers


def parse_extra_body(text: str | None) -> dict:
    """``--extra-body '{"top_k": 20}'``: a JSON object."""
    if text is None:
        return {}
    try:
        body = json.loads(text)
    except ValueError as e:
        fail("extra-body", text, 'a JSON object, e.g. \'{"top_k": 20}\'', f"not JSON: {e}")
    if not isinstance(body, dict):
        fail("extra-body", text, 'a JSON object, e.g. \'{"top_k": 20}\'',
             f"a JSON {type(body).__name__}")
    return body


def apply_old_forms(args: argparse.Namespace) -> None:
    """The old flags in vLLM's terms: ``--out DIR``, ``--arrival``; and ``--output-len`` /
    ``--input-len`` onto each dataset's own length flags, as vLLM maps them."""
    if args.out is not None:
        if args.result_dir is not None and args.result_dir != args.out:
            fail("out", args.out, f"left out with --result-dir={args.result_dir!r}", "--out DIR is "
                 "--save-result --result-dir DIR")
        args.save_result, args.result_dir = True, args.out
    if args.arrival == "at_once":
        if args.request_rate != math.inf:
            fail("arrival", "at_once", "left out with --request-rate",
                 "at_once is --request-rate inf")
    elif args.arrival == "fixed":
        args.burstiness = math.inf
    elif args.arrival == "poisson" and args.burstiness != 1.0:
        fail("burstiness", args.burstiness, "1 with --arrival poisson",
             "give --arrival gamma, or leave it out")
    if args.input_len is not None:
        args.random_input_len = args.input_len
    if args.output_len is not None:
        args.random_output_len = args.sharegpt_output_len = \
            args.prefix_repetition_output_len = args.output_len


def check_args(args: argparse.Namespace) -> None:
    """Every option's value, before anything is sent (ValueError: ``name=value; must ...``)."""
    from batchlab.loadgen.schedule import Schedule
    from batchlab.loadgen.vllm_result import parse_metric_percentiles, parse_percentile_metrics
    apply_old_forms(args)
    if args.backend not in BACKENDS:
        fail("backend", args.backend, f"one of {list(BACKENDS)}")
    if args.endpoint is not None and args.endpoint not in ENDPOINT_PATHS:
        fail("endpoint", args.endpoint, f"one of {list(ENDPOINT_PATHS)}")
    check_int("num-prompts", args.num_prompts)
    check_int("concurrency", args.concurrency, allow_none=True)
    check_int("max-concurrency", args.max_concurrency, allow_none=True)
    check_int("num-warmups", args.num_warmups, 0)
    check_int("port", args.port)
    check_number("request-timeout", args.request_timeout, 0, strict=True)
    check_number("max-duration", args.max_duration, 0, strict=True)
    if not 0 < args.slo_target <= 1:
        fail("slo-target", args.slo_target, "a share of requests in (0, 1], e.g. 0.9")
    Schedule(args.request_rate, args.burstiness, args.ramp_up_strategy, args.ramp_up_start_rps,
             args.ramp_up_end_rps)
    if args.concurrency is not None and (args.rates or args.max_concurrency
                                         or args.ramp_up_strategy):
        fail("concurrency", args.concurrency,
             "left out with --rates, --ramp-up-strategy or --max-concurrency",
             "a closed loop has no rate: use --max-concurrency with a rate instead")
    if args.rates and args.ramp_up_strategy:
        fail("rates", args.rates, "left out with --ramp-up-strategy",
             "a sweep runs each rate steadily")
    sources = [name for name in ("prompts", "workload", "dataset_name")
               if getattr(args, name) is not None]
    if len(sources) > 1:
        fail(sources[0].replace("_", "-"), getattr(args, sources[0]),
             f"left out with --{sources[1].replace('_', '-')} (pick one source of prompts)")
    if args.workload and (args.rates or args.ramp_up_strategy):
        fail("workload", args.workload, "left out with --rates and --ramp-up-strategy",
             "a workload file has its own arrival times")
    parse_headers(args.header)
    parse_extra_body(args.extra_body)
    parse_percentile_metrics(args.percentile_metrics)
    parse_metric_percentiles(args.metric_percentiles)
    if (args.result_dir or args.result_filename or args.save_detailed) and not args.save_result:
        fail("save-result", False, "given with --result-dir, --result-filename or --save-detailed",
             "as vLLM's: --save-result writes the file")
    dataset_config(args)


def dataset_config(args: argparse.Namespace):
    from batchlab.loadgen.datasets import DatasetConfig
    return DatasetConfig(args.dataset_name or "random", args.dataset_path, args.random_input_len,
                         args.random_output_len, args.random_range_ratio, args.random_prefix_len,
                         args.sharegpt_output_len, args.prefix_repetition_prefix_len,
                         args.prefix_repetition_suffix_len, args.prefix_repetition_num_prefixes,
                         args.prefix_repetition_output_len, args.disable_shuffle,
                         args.no_oversample)


def endpoint_of(args: argparse.Namespace) -> str:
    if args.endpoint is not None:
        return ENDPOINT_PATHS[args.endpoint]
    return "chat" if args.backend == "openai-chat" else "completions"


def schedule_for(args: argparse.Namespace, rate: float | None):
    from batchlab.loadgen.schedule import Schedule
    if rate is None:
        return Schedule(args.request_rate, args.burstiness, args.ramp_up_strategy,
                        args.ramp_up_start_rps, args.ramp_up_end_rps)
    return Schedule(rate, args.burstiness)


def make_requests_for(args: argparse.Namespace, tok):
    """rate (None: the command line's own schedule) -> the load's requests: the same prompts at
    every rate, sent at vLLM's planned times."""
    from dataclasses import replace

    from batchlab.loadgen import replay_requests
    from batchlab.loadgen.prompts import as_text, read_prompts
    text = args.text or endpoint_of(args) == "chat"
    if args.workload:
        reqs = replay_requests(args.workload, tok)
        return lambda rate: as_text(reqs, tok) if text else reqs
    if args.prompts:
        source = read_prompts(args.prompts, args.output_len or args.random_output_len, tok)
        base = [replace(source[i % len(source)], request_id=f"r{i:04d}")
                for i in range(args.num_prompts)]
    else:
        base = dataset_config(args).sample(args.num_prompts, tok, args.seed)
    if text:
        base = as_text(base, tok)

    def at(rate: float | None):
        if args.concurrency is not None:
            return base
        times = schedule_for(args, rate).send_times(len(base), args.seed)
        return [replace(r, arrival_time=float(t)) for r, t in zip(base, times)]
    return at


def ignore_eos_for(args: argparse.Namespace) -> bool:
    """vLLM's rule: asked for, or the random dataset (and a workload file, like vLLM's timed
    traces)."""
    if args.ignore_eos is not None:
        return args.ignore_eos
    return bool(args.workload) or (args.prompts is None
                                   and (args.dataset_name or "random") == "random")


def _print_result(result, bench: dict, metrics: list[str], percentiles: list[float]) -> None:
    from batchlab.loadgen.vllm_result import format_result
    print(result.summary())
    print(format_result(bench, metrics, percentiles))


def save_result(result, bench: dict, path: Path) -> None:
    """vLLM's result JSON at ``path``, and one row per request beside it
    (``<name>.requests.csv``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(bench, default=float))
    result.requests_df().to_csv(path.with_suffix(".requests.csv"), index=False)
    print(f"saved {path} and {path.with_suffix('.requests.csv')}")


def result_path(args: argparse.Namespace, schedule, model: str, rate: float | None) -> Path:
    from batchlab.loadgen.vllm_result import result_filename
    label = args.label or args.backend
    name = result_filename(label, schedule, args.max_concurrency, model,
                           datetime.now().strftime("%Y%m%d-%H%M%S"))
    if args.result_filename:
        name = (args.result_filename if rate is None
                else f"{Path(args.result_filename).stem}-{rate:g}qps.json")
    return Path(args.result_dir or ".") / name


def run(args: argparse.Namespace) -> int:
    from batchlab.loadgen import run_load
    from batchlab.loadgen.sweep import parse_goodput, parse_rates, rate_sweep
    from batchlab.loadgen.vllm_result import (parse_metric_percentiles, parse_percentile_metrics,
                                              result_json)
    check_args(args)
    rates = parse_rates(args.rates) if args.rates else None
    slo = parse_goodput(args.goodput) if args.goodput else None
    metrics, percentiles = parse_percentile_metrics(args.percentile_metrics), \
        parse_metric_percentiles(args.metric_percentiles)
    tok = _tokenizer(args.tokenizer)
    make_requests = make_requests_for(args, tok)
    closed = args.concurrency is not None
    extra = {k: v for k, v in (("top_p", args.top_p), ("top_k", args.top_k), ("min_p", args.min_p),
                               ("seed", args.sampling_seed)) if v is not None}
    extra.update(parse_extra_body(args.extra_body))
    url = args.base_url or f"http://{args.host}:{args.port}"
    load_kwargs = dict(model=args.model, api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
                       endpoint=endpoint_of(args),
                       temperature=args.temperature, ignore_eos=ignore_eos_for(args),
                       request_timeout=args.request_timeout, max_duration=args.max_duration,
                       extra_body=extra,
                       warmup=args.num_warmups, progress=not args.disable_tqdm, tokenizer=tok,
                       headers=parse_headers(args.header),
                       continuous_usage_stats=args.continuous_usage_stats)

    def report(result, rate: float | None) -> None:
        schedule = schedule_for(args, rate)
        bench = result_json(result, num_prompts=args.num_prompts, schedule=schedule,
                            percentile_metrics=metrics,
                            percentiles=percentiles, slo=slo, backend=args.backend,
                            label=args.label,
                            tokenizer_id=getattr(tok, "name_or_path", None) or args.tokenizer,
                            detailed=args.save_detailed)
        _print_result(result, bench, metrics, percentiles)
        if args.save_result:
            save_result(result, bench, result_path(args, schedule, result.model, rate))

    if rates:
        def each(rate, result):
            print(f"\n--- rate {rate:g}/s")
            report(result, rate)
        sweep, best = rate_sweep(url, make_requests, rates, slo, args.slo_target, on_result=each,
                                 max_concurrency=args.max_concurrency, **load_kwargs)
        columns = [c for c in ("rate", "achieved_rate", "num_finished", "request_throughput",
                               "ttft_p50",
                               "ttft_p99", "tpot_p50", "goodput", "slo_attainment", "cut")
                   if c in sweep]
        print("\n" + sweep[columns].to_string(index=False, float_format="{:.3f}".format))
        if best is not None:
            if best == float("inf"):
                answer = f"above the sweep (every rate met it; try rates over {max(rates):g})"
            elif best != best:                   # NaN
                answer = f"below the sweep (even {min(rates):g}/s missed it; try lower rates)"
            else:
                answer = f"{best:.3f} req/s"
            print(f"DistServe's goodput: the highest rate at which {args.slo_target:.0%} of "
                  f"requests met {slo}: {answer}")
        if args.save_result:
            sweep.to_csv(Path(args.result_dir or ".") / "sweep.csv", index=False)
        return 0 if all(o == {"ok": n}
                        for o, n in zip(sweep["outcomes"], sweep["num_requests"])) else 1
    open_rate = None if closed or args.request_rate == math.inf else args.request_rate
    result = run_load(url, make_requests(None), mode="closed" if closed else "open",
                      concurrency=args.concurrency,
                      target_rate=open_rate, max_concurrency=args.max_concurrency, **load_kwargs)
    report(result, None)
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
