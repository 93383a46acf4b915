"""Checkers for notebook 14 (before you rent the GPUs).

14.1 plans one deployment's memory (instant); 14.2 runs the notebook's rate sweep (about a
minute, once per session: cached).
"""

from __future__ import annotations

from functools import lru_cache

from batchlab.exercises import Verdict, compare, exercise

SWEEP_RATES = (4, 12, 20, 28, 36, 44, 52, 60, 68)
SLO = {"ttft_p90_ms": 500, "tpot_p90_ms": 15}
USD_PER_GPU_HOUR = 3.00


def kv_blocks() -> int:
    """14.1: KV blocks per GPU of Llama-3-8B, TP2, H100, utilization 0.8, blocks of 32 tokens."""
    from batchlab.predict import Deployment, EngineArgs
    args = EngineArgs(gpu_memory_utilization=0.8, block_size=32)
    return Deployment("Llama-3-8B", "H100", 2, args=args).memory.num_blocks


@lru_cache(maxsize=1)
def cheapest_under_target() -> dict[str, float]:
    """14.2: the candidates with the highest rate under ``SLO`` (several when tied) and each one's
    dollars per million tokens."""
    from batchlab.predict import Deployment, TrafficSpec
    from batchlab.predict.planning import best_rate, cost_per_million_tokens, sweep_rates
    candidates = {"1 GPU: TP1": Deployment("Llama-3-8B", "H100"),
                  "2 GPUs: TP2": Deployment("Llama-3-8B", "H100", 2),
                  "2 GPUs: 2 x TP1": Deployment("Llama-3-8B", "H100", data_parallel_size=2)}
    table = sweep_rates(candidates,
                        lambda rate: TrafficSpec(int(rate * 30), rate, input_len=800,
                                                 output_len=250,
                                                             prefix_len=200, num_prefix_groups=4,
                                                             seed=0), SWEEP_RATES)
    best = best_rate(table, SLO)
    top = best[best["best_rate"] == best["best_rate"].max()]
    return {str(name): cost_per_million_tokens(row["num_gpus"], USD_PER_GPU_HOUR,
                                               row["output_tok_s"])
            for name, row in top.iterrows()}


@exercise("14.1")
def check_14_1(answer) -> Verdict:
    if answer is None or answer is ...:
        return Verdict("not attempted", "set answer to an integer and run the cell again")
    return compare(answer, kv_blocks(), what="the number of KV blocks per GPU")


@exercise("14.2")
def check_14_2(answer) -> Verdict:
    if answer is None or answer is ...:
        return Verdict("not attempted", "set answer to (name, dollars) and run the cell again")
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Verdict("wrong", f"expected (name, dollars), got {answer!r}")
    best = cheapest_under_target()             # several names when candidates tie on the rate
    if answer[0] not in best:
        return Verdict("wrong",
                       f"another candidate carries more under that target; got {answer[0]!r}")
    return compare(answer[1], best[answer[0]], rtol=0.01,
                   what=f"{answer[0]}'s dollars per million output tokens")
