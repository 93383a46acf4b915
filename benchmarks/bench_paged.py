"""Benchmark of the paged KV cache against the slot cache, side by side in one run (prints numbers).

    .venv/bin/python benchmarks/bench_paged.py [--context 256] [--repeats 7] [--rounds 2] [--threads 1]

Prints:

1. the decode step on the real model at batch 1, 8 and 32, every sequence at ``--context``
   cached tokens, with the slot cache and with the paged cache (block size 16, each sequence's
   blocks scattered over the pool as they are after a busy run), and the ratio paged / slot.
   Goal: paged within 1.25x of slot at every batch size (the block-table read must not undo
   batching). Slot and paged steps alternate, ``--rounds`` times, so drift hits both alike.
2. the TTFT of a request whose prompt is a 256-token shared prefix plus a short question, served
   alone on the real model with prefix caching off and on (the shared prefix cached by an earlier
   request with the same system prompt); the ratio off / on. Goal: at least a 3x cut.
3. a decode step on the paged cache whose sequences' contexts differ (uniform in a range), with
   the decodes attending in groups of similar context (``step_layout.context_groups``) and in
   one group padded to the longest context (the code before grouping), alternated; the ratio
   grouped / one group. Goal: below 1 where contexts spread widely, about 1 where they do not.

Nothing is asserted; timings on a shared CPU drift, so the figures are medians of repeats.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from batchlab.backends.model_backend import ModelBackend
from batchlab.engine import Engine
from batchlab.model import load_model, step_layout
from batchlab.model.llama import LlamaWeights, SeqChunk
from batchlab.model.paged_kv_cache import PagedSeqChunk
from batchlab.model.profiler import time_step
from batchlab.requests import Request
from batchlab.schedulers import ContinuousBatcher


def decode_steps(weights: LlamaWeights, batch: int, context: int, repeats: int, seed: int = 0
                 ) -> tuple[float, float]:
    """Median seconds of one decode step of ``batch`` sequences at ``context``: (slot, paged)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, weights.config.vocab_size, (batch,), generator=gen).tolist()
    slot_cache = weights.new_kv_cache(batch, context + 1)
    slot_chunks = [SeqChunk(s, context, [ids[s]], True) for s in range(batch)]
    # Paged: room for the same tokens, blocks handed out in a shuffled order (a pool after churn).
    block_size = 16
    per_seq = -(-(context + 1) // block_size)
    paged = weights.new_paged_kv_cache(batch * per_seq + 8, block_size)
    order = list(range(paged.num_blocks))
    random.Random(seed).shuffle(order)
    paged_chunks = []
    for s in range(batch):
        table = order[s * per_seq:(s + 1) * per_seq]
        paged_chunks.append(PagedSeqChunk(table, context, [ids[s]], True))
    return (time_step(weights, slot_cache, slot_chunks, repeats),
            time_step(weights, paged, paged_chunks, repeats))


def mixed_decode_steps(weights: LlamaWeights, lengths: list[int], repeats: int, seed: int = 0
                       ) -> tuple[float, float]:
    """Median seconds of one paged decode step of sequences with contexts ``lengths``: (attending
    in context groups, in one group padded to the longest)."""
    block_size = 16
    need = [-(-(n + 1) // block_size) for n in lengths]
    paged = weights.new_paged_kv_cache(sum(need) + 8, block_size)
    order = list(range(paged.num_blocks))
    random.Random(seed).shuffle(order)
    chunks, used = [], 0
    for n, k in zip(lengths, need):
        chunks.append(PagedSeqChunk(order[used:used + k], n, [5], True))
        used += k
    default, times = step_layout.GROUP_CALL_KEYS, {}
    for keys in ((default, 10**12) if seed % 2 == 0 else (10**12, default)):   # which goes first alternates
        step_layout.GROUP_CALL_KEYS = keys                 # 10**12: never split, one group as before grouping
        try:
            times[keys] = time_step(weights, paged, chunks, repeats)
        finally:
            step_layout.GROUP_CALL_KEYS = default
    return times[default], times[10**12]


def shared_prompt_ttft(lm, prefix_caching: bool, system: list[int], question: list[int],
                       repeats: int) -> float:
    """Median TTFT (s) of one request = ``system + question`` served alone, right after a warm-up
    request with the same system prompt (which fills the prefix cache when it is on)."""
    ttfts = []
    for i in range(repeats):
        backend = ModelBackend(lm, num_slots=4, max_seq_len=512, paged=True,
                               enable_prefix_caching=prefix_caching)
        warm = Request("warm", system + [question[0] ^ 1] + question[1:], 1, arrival_time=0.0)
        probe = Request("probe", system + question, 1, arrival_time=10.0)
        trace = Engine(ContinuousBatcher(4, 2048), backend).run([warm, probe])
        rec = trace.requests[1]
        ttfts.append(rec.token_times[0] - rec.arrival_time)
    return statistics.median(ttfts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=256, help="cached tokens per sequence in decode steps")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=2, help="alternations of slot and paged timing")
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (1 on a CPU shared with other jobs: with 2 threads on a "
                             "busy 2-core machine every parallel op waits for the other core)")
    args = parser.parse_args()

    lm = load_model(threads=args.threads)
    weights = LlamaWeights.from_hf(lm.model)
    print(f"device {lm.device} ({lm.dtype}), {torch.get_num_threads()} threads, "
          f"decode context {args.context}, block size 16")
    print(f"{'batch':>5} {'slot ms':>9} {'paged ms':>9} {'paged/slot':>10}")
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        slot, paged = [], []
        for r in range(args.rounds):
            s, p = decode_steps(weights, b, args.context, args.repeats, seed=r)
            slot.append(s)
            paged.append(p)
        s, p = statistics.median(slot) * 1e3, statistics.median(paged) * 1e3
        print(f"{b:>5} {s:>9.1f} {p:>9.1f} {p / s:>9.2f}x   (goal <= 1.25x)")

    print(f"{'decodes, contexts':>22} {'groups':>6} {'grouped ms':>10} {'one group ms':>12} {'ratio':>6}")
    spread = random.Random(1)
    for batch, low, high in ((8, 50, 800), (32, 50, 800), (32, 200, 300), (16, 20, 200)):
        lengths = [spread.randint(low, high) for _ in range(batch)]
        groups = len(step_layout.context_groups([n + 1 for n in lengths]))
        times = [mixed_decode_steps(weights, lengths, args.repeats, seed=r) for r in range(args.rounds)]
        g, o = (statistics.median(t[i] for t in times) * 1e3 for i in (0, 1))
        print(f"{f'{batch} x {low}-{high}':>22} {groups:>6} {g:>10.1f} {o:>12.1f} {g / o:>5.2f}x")

    rng = random.Random(0)
    vocab = weights.config.vocab_size
    system = [rng.randrange(vocab) for _ in range(256)]
    question = [rng.randrange(vocab) for _ in range(8)]
    ttft_repeats = max(3, args.repeats // 2)
    off = shared_prompt_ttft(lm, False, system, question, ttft_repeats)
    on = shared_prompt_ttft(lm, True, system, question, ttft_repeats)
    print(f"TTFT of a {len(system)}+{len(question)}-token prompt, served alone: prefix caching off "
          f"{off * 1e3:.1f} ms, on (256 tokens cached) {on * 1e3:.1f} ms: {off / on:.1f}x cut (goal >= 3x)")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s)")
