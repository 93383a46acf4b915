"""Worked solutions for notebook 14 (before you rent the GPUs)."""

from batchlab.predict import Deployment, EngineArgs, TrafficSpec
from batchlab.predict.planning import best_rate, cost_per_million_tokens, sweep_rates


def solve_14_1() -> int:
    """Plan the deployment with the two flags changed; the memory plan counts the blocks."""
    args = EngineArgs(gpu_memory_utilization=0.8, block_size=32)
    return Deployment("Llama-3-8B", "H100", 2, args=args).memory.num_blocks


def solve_14_2() -> tuple[str, float]:
    """The notebook's sweep under the new target; the candidate with the highest rate, and its cost."""
    candidates = {"1 GPU: TP1": Deployment("Llama-3-8B", "H100"), "2 GPUs: TP2": Deployment("Llama-3-8B", "H100", 2),
                  "2 GPUs: 2 x TP1": Deployment("Llama-3-8B", "H100", data_parallel_size=2)}

    def chat_traffic(rate: float) -> TrafficSpec:
        return TrafficSpec(num_prompts=int(rate * 30), request_rate=rate, input_len=800, output_len=250,
                           prefix_len=200, num_prefix_groups=4, seed=0)

    table = sweep_rates(candidates, chat_traffic, [4, 12, 20, 28, 36, 44, 52, 60, 68])
    best = best_rate(table, {"ttft_p90_ms": 500, "tpot_p90_ms": 15})
    name = str(best["best_rate"].idxmax())
    return name, cost_per_million_tokens(best.loc[name, "num_gpus"], 3.00, best.loc[name, "output_tok_s"])


SOLUTIONS = {"14.1": solve_14_1, "14.2": solve_14_2}
WRONG = {"14.1": 1, "14.2": ("1 GPU: TP1", 0.1)}
