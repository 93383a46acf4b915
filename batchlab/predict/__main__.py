"""``python -m batchlab.predict``: predict a vLLM deployment's latencies and throughput.

The rules and their reasons: ``docs/predicting-a-deployment.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from batchlab.steptime.device_presets import load_device_presets
from batchlab.cluster.policies import ROUTING_POLICIES
from batchlab.predict.deployment import Deployment, predict
from batchlab.engine_args import EngineArgs
from batchlab.predict.recommend import SLO, recommend
from batchlab.predict.traffic import ARRIVAL_KINDS, TrafficSpec, read_trace
from batchlab.shapes import MODEL_SHAPES


class OneLineParser(argparse.ArgumentParser):
    """An unknown or malformed flag ends with one line naming it (not argparse's usage block)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see --help for the flags and what each allows)\n")


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m batchlab.predict",
                      description="Predict a vLLM deployment's latencies and throughput on GPUs, "
                                  "before renting them.")
    p.add_argument("--model", required=True,
                   help=f"one of {sorted(MODEL_SHAPES)}, or a config.json path")
    p.add_argument("--gpu", required=True,
                   help=f"a preset: {sorted(load_device_presets())} (with --recommend, "
                                                "several, comma-separated)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                   help="replicas behind a router")
    p.add_argument("--routing", default="least_outstanding",
                   help=f"the router's policy: {list(ROUTING_POLICIES)}")
    p.add_argument("--vllm-version",
                   help="the vLLM version whose measured kernels to use: the newest measured at "
                                          "or below it (default: the newest measured)")
    EngineArgs.add_cli_flags(p.add_argument_group("vLLM's flags (vLLM's names; unset: vLLM's "
                                                  "default for the GPU)"))
    load = p.add_argument_group("traffic: generated (vllm bench serve's random dataset) or --trace")
    load.add_argument("--trace",
                      help="CSV (with a header) or JSONL: arrival_s, input_tokens, output_tokens"
                                      "[, prefix_group, prefix_len]")
    load.add_argument("--num-prompts", type=int, default=1000)
    load.add_argument("--request-rate", type=float, default=math.inf,
                      help="req/s (inf: all at once)")
    load.add_argument("--burstiness", type=float, default=1.0,
                      help="gamma shape: 1 = Poisson, < 1 burstier")
    load.add_argument("--arrival", default="poisson", choices=ARRIVAL_KINDS)
    load.add_argument("--input-len", type=int, default=1024,
                      help="prompt tokens after the shared prefix")
    load.add_argument("--output-len", type=int, default=128)
    load.add_argument("--range-ratio", type=float, default=0.0,
                      help="lengths uniform in len*(1 +- ratio)")
    load.add_argument("--prefix-len", type=int, default=0,
                      help="shared prefix tokens (a system prompt)")
    load.add_argument("--num-prefix-groups", type=int, default=1, help="distinct shared prefixes")
    load.add_argument("--seed", type=int, default=0)
    p.add_argument("--metric-percentiles", default="50,90,99",
                   help="comma-separated, e.g. 50,90,99")
    rec = p.add_argument_group("--recommend: the cheapest deployments meeting an SLO at "
                               "--request-rate")
    rec.add_argument("--recommend", action="store_true",
                     help="search GPUs x TP x replicas x batch knobs")
    rec.add_argument("--slo-ttft-ms", type=float)
    rec.add_argument("--slo-tpot-ms", type=float)
    rec.add_argument("--slo-percentile", type=float, default=99.0)
    rec.add_argument("--max-gpus", type=int, default=8, help="the most GPUs a deployment may use")
    rec.add_argument("--gpu-hour-usd",
                     help="prices per GPU-hour, e.g. H100=2.5,A100=1.6 (adds $ per M tokens)")
    rec.add_argument("--pd-link", default="nvlink4",
                     help="prefill/decode splits join the search, the KV crossing "
                                                          "this link (KV_LINKS); 'none': no splits")
    p.add_argument("--out", help="write vllm bench serve's result JSON here")
    return p


def parse_prices(text: str | None) -> dict[str, float]:
    """``H100=2.5,A100=1.6`` as a dict (one line naming a bad entry)."""
    prices = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        gpu, _, price = item.partition("=")
        try:
            prices[gpu.strip()] = float(price)
        except ValueError:
            raise ValueError(f"gpu_hour_usd={item!r}; must be GPU=dollars, e.g. H100=2.5") from None
    return prices


def run_recommend(args: argparse.Namespace, engine_args: EngineArgs, traffic) -> list[str]:
    """The --recommend search, in lines."""
    slo = SLO(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_percentile)
    gpus = [g.strip() for g in args.gpu.split(",") if g.strip()]
    table, search = recommend(args.model, gpus, traffic, slo, args.max_gpus, args=engine_args,
                              usd_per_gpu_hour=parse_prices(args.gpu_hour_usd),
                              vllm_version=args.vllm_version,
                              pd_link=None if args.pd_link == "none" else args.pd_link)
    lines = [(f"the cheapest deployments of {args.model} meeting {slo.describe()} "
              f"for {traffic.describe()}"),
             (f"({search['predictions']} candidates predicted in {search['seconds']:.0f} s; "
              "margins: how far under each bound; cost: GPU-hours per million output tokens)"), ""]
    return lines + table.to_string(float_format=lambda v: f"{v:,.3g}").splitlines()


def run(args: argparse.Namespace) -> list[str]:
    engine_args = EngineArgs.from_cli(args)
    if args.trace:
        traffic = read_trace(args.trace)
    else:
        traffic = TrafficSpec(args.num_prompts, args.request_rate, args.burstiness, args.arrival,
                              args.input_len, args.output_len, args.range_ratio, args.prefix_len,
                              args.num_prefix_groups, args.seed).generate()
    if args.recommend:
        if not args.trace and args.request_rate == math.inf:
            raise ValueError("request_rate=inf; --recommend needs a rate to meet (--request-rate) "
                             "or a --trace")
        return run_recommend(args, engine_args, traffic)
    deployment = Deployment(args.model, args.gpu, args.tensor_parallel_size,
                            args.data_parallel_size, engine_args, args.routing, args.vllm_version)
    try:
        percentiles = tuple(float(p) for p in args.metric_percentiles.split(","))
    except ValueError:
        raise ValueError(f"metric_percentiles={args.metric_percentiles!r}; must be numbers "
                         "separated by commas") from None
    if not all(0 < p < 100 for p in percentiles):
        raise ValueError(f"metric_percentiles={args.metric_percentiles!r}; must each be "
                         "between 0 and 100")
    prediction = predict(deployment, traffic, percentiles)
    prediction.setup.update(request_rate=None if args.trace else args.request_rate,
                            burstiness=None if args.trace else args.burstiness)
    lines = (deployment.describe() + [f"traffic: {traffic.describe()}", ""]
             + prediction.summary_lines())
    lines.append(f"(predicted in {prediction.wall_seconds:.1f} s of wall time)")
    if args.out:
        Path(args.out).write_text(json.dumps(prediction.bench_result(), indent=1) + "\n",
                                  encoding="utf-8")
        lines.append(f"wrote {args.out}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        lines = run(args)
    except ValueError as err:
        print(f"python -m batchlab.predict: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
