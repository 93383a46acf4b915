"""Benchmark of speculative decoding (prompt lookup) on the real model, side by side in one run.

    .venv/bin/python benchmarks/bench_speculative.py [--batches 1 32] [--k 4] [--rounds 2]
        [--kind code_edit] [--max-new-tokens 128] [--dtype float32] [--early-exit 20 27]

For each batch size ``B``: ``B`` requests (at least 4) of one kind of task (``batchlab.workloads.tasks``;
copy-heavy ``code_edit`` by default) served at once by ``ContinuousBatcher(max_num_seqs=B)``,
greedy, in fp32, three ways alternated ``--rounds`` times (drift hits all alike): without
speculation, with prompt lookup drafting ``k`` tokens always, and with the batch-size policy
(``--policy``: vLLM's ``num_speculative_tokens_per_batch_size``). Prints each one's output
tokens per second of wall time (median over rounds), its ratio to no speculation, the drafts'
acceptance (accepted / drafted tokens) and the tokens a check emitted on average, and checks
that the three gave the same tokens (fp32 greedy: they must). ``--early-exit L ...`` adds a
self-draft of ``k`` tokens from the model's first ``L`` layers for each ``L`` given.

Goals (issue 35): at batch 1, at least 1.5x the tokens/s without speculation; at batch 32 with
the policy, no slower than 0.95x. Nothing is asserted; timings on a shared CPU drift.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

from batchlab.backends.model_backend import ModelBackend
from batchlab.engine import Engine
from batchlab.model import load_model
from batchlab.model.cpu_kernels import describe_kernels, kernel_report
from batchlab.schedulers import ContinuousBatcher
from batchlab.speculative import SpeculativeConfig
from batchlab.workloads.tasks import TASK_KINDS, task_requests

DEFAULT_POLICY = [[1, 4, 4], [5, 8, 2], [9, 1024, 0]]
MIN_REQUESTS = 4          # a batch of 1 serves 4 requests one after another


def serve(lm, batch: int, kind: str, max_new_tokens: int, spec: SpeculativeConfig | None) -> dict:
    """One run: wall seconds, output tokens, acceptance, and each request's tokens."""
    requests = task_requests(kind, max(batch, MIN_REQUESTS), lm.tokenizer, max_new_tokens)
    max_len = max(r.prompt_len for r in requests) + max_new_tokens
    backend = ModelBackend(lm, num_slots=batch, max_seq_len=max_len, speculative_config=spec)
    engine = Engine(ContinuousBatcher(batch, max(2048, batch * 8)), backend)
    t0 = time.perf_counter()
    trace = engine.run(requests)
    wall = time.perf_counter() - t0
    checks = [c for r in trace.requests for c in r.spec_checks]
    return {"wall": wall, "tokens": sum(len(r.output_ids) for r in trace.requests),
            "drafted": sum(d for d, _ in checks), "accepted": sum(a for _, a in checks), "checks": len(checks),
            "outputs": {r.request_id: r.output_ids for r in trace.requests}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--lookup", type=int, nargs=2, default=[2, 3], metavar=("MIN", "MAX"),
                        help="prompt_lookup_min and prompt_lookup_max")
    parser.add_argument("--policy", type=json.loads, default=DEFAULT_POLICY,
                        help="num_speculative_tokens_per_batch_size, as JSON")
    parser.add_argument("--kind", choices=TASK_KINDS, default="code_edit")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--early-exit", type=int, nargs="*", default=[], metavar="LAYER",
                        help="also draft with the model's first LAYER layers (method early_exit)")
    args = parser.parse_args()
    lm = load_model(dtype=args.dtype)
    always = SpeculativeConfig(args.k, "ngram", args.lookup[0], args.lookup[1])
    ways = {"none": None, "always": always,
            "policy": replace(always, num_speculative_tokens_per_batch_size=args.policy)}
    ways.update({f"exit {layer}": SpeculativeConfig(args.k, "early_exit", early_exit_layer=layer)
                 for layer in args.early_exit})
    print(f"{describe_kernels(kernel_report())}\n{lm.name} {args.dtype}, {args.kind}, max_new_tokens {args.max_new_tokens}, "
          f"k={args.k}, lookup {args.lookup}, policy {args.policy}")
    for batch in args.batches:
        runs = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, spec in ways.items():
                runs[name].append(serve(lm, batch, args.kind, args.max_new_tokens, spec))
        base = statistics.median(r["tokens"] / r["wall"] for r in runs["none"])
        same = all(r["outputs"] == runs["none"][0]["outputs"] for rs in runs.values() for r in rs)
        print(f"batch {batch}: same tokens in every run: {same}")
        for name, rs in runs.items():
            rate = statistics.median(r["tokens"] / r["wall"] for r in rs)
            r = rs[0]
            acc = f"acceptance {r['accepted'] / r['drafted']:.2f} ({r['accepted']}/{r['drafted']}), " \
                  f"{(r['accepted'] + r['checks']) / r['checks']:.2f} tokens a check" if r["checks"] else "no drafts"
            each = ", ".join(f"{x['tokens'] / x['wall']:.1f}" for x in rs)
            print(f"  {name:7s} {rate:7.1f} tok/s  {rate / base:5.2f}x  ({each}); {acc}")


if __name__ == "__main__":
    main()
