"""How fast is a deployment prediction? 10,000 requests at TP1, at TP4, and over 8 replicas; and
a ``--recommend`` search.

    python benchmarks/bench_predict.py                     # the three cases, 10,000 requests each
    python benchmarks/bench_predict.py --requests 2000     # smaller, quicker

Each case predicts a chat-like load (a 100-token shared system prompt, 500 more prompt tokens,
250 output tokens, Poisson arrivals) at a rate its deployment keeps up with: Llama-2-7B on one
H100 at 10 req/s, Llama-2-70B on four H100s (tensor parallel 4) at 6 req/s, Llama-3-8B on eight
H100s behind a router at 80 req/s. Printed: each case's wall time (building the requests
included) and simulated requests per wall second, against the goals (TP1 at most 10 s, TP4 or 8
replicas at most 30 s for 10,000 requests). Then ``recommend`` for Llama-3-8B on H100s and A100s
at 20 req/s (600 requests, TTFT p99 < 500 ms, TPOT p99 < 30 ms): candidates predicted and wall
time, against the goal of 50 or more candidates in at most 2 minutes.
"""

from __future__ import annotations

import argparse
import time

from batchlab.predict import Deployment, EngineArgs, TrafficSpec, predict
from batchlab.predict.recommend import SLO, recommend

CASES = (("TP1: Llama-2-7B on 1 H100", "Llama-2-7B", 1, 1, 10.0, 10.0),
         ("TP4: Llama-2-70B on 4 H100s", "Llama-2-70B", 4, 1, 6.0, 30.0),
         ("8 replicas: Llama-3-8B on 8 H100s", "Llama-3-8B", 1, 8, 80.0, 30.0))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    args = parser.parse_args(argv)
    flags = EngineArgs(max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=4096)
    for label, model, tp, dp, rate, goal in CASES:
        traffic = TrafficSpec(args.requests, rate, input_len=500, output_len=250, prefix_len=100, seed=1)
        start = time.perf_counter()
        prediction = predict(Deployment(model, "H100", tp, dp, flags), traffic.generate())
        wall = time.perf_counter() - start
        r = prediction.bench_result()
        print(f"{label:36} {wall:6.1f} s wall for {args.requests:,} requests ({args.requests / wall:,.0f} req/s; "
              f"goal at 10,000: {goal:.0f} s); TTFT p50 {r['median_ttft_ms']:.0f} ms, TPOT p50 "
              f"{r['median_tpot_ms']:.1f} ms, {'saturated' if prediction.saturation()['saturated'] else 'keeps up'}")
    traffic = TrafficSpec(600, 20.0, input_len=800, output_len=250, seed=1).generate()
    table, search = recommend("Llama-3-8B", ["H100", "A100"], traffic, SLO(500, 30))
    best = table.iloc[0]
    print(f"{'recommend: Llama-3-8B, H100 and A100':36} {search['seconds']:6.1f} s wall for {search['predictions']} "
          f"candidates (goal: >= 50 in 120 s); cheapest: {best.gpu} TP{best.tp} x {best.replicas}")


if __name__ == "__main__":
    main()
