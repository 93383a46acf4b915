"""Worked solutions for notebook 15 (speculative decoding and the batch)."""

from batchlab.sim import SimBackend
from batchlab.experiments.speculation import crossover, serve_batches
from batchlab.requests import Request
from batchlab.speculative import AcceptanceModel, SpeculativeConfig
from batchlab.vllm_sim import VllmReplica


def solve_15_1() -> float:
    """Each draft token survives with chance alpha, given all before it did: a check emits one
    token for sure, plus alpha + alpha^2 + ... + alpha^k accepted ones."""
    alpha, k = 0.7, 4
    return 1 + sum(alpha ** i for i in range(1, k + 1))


def solve_15_2() -> int:
    """Simulate each batch size with and without speculation and take the first that loses."""
    cost, acceptance = VllmReplica("Llama-3-8B", "H100").step_model, AcceptanceModel(0.5)

    def backend(spec, batch):
        return SimBackend(cost, 10**7, block_size=16, speculative_config=spec, acceptance=acceptance if spec else None)

    def requests(n):
        return [Request(f"r{i}", None, 128, prompt_len=512) for i in range(n)]

    table, _ = serve_batches(backend, requests, [1, 8, 32, 128, 512],
                             {"none": None, "ngram": SpeculativeConfig(3, method="ngram")}, min_requests=4)
    return crossover(table, "ngram")


def solve_15_3() -> float:
    """A check emits 1 + alpha + ... + alpha^k tokens on average and costs 1 + k·c plain steps;
    it pays while 1 + k·c is below the tokens, so c must stay below (tokens - 1) / k."""
    alpha, k = 0.6, 3
    tokens = 1 + sum(alpha ** i for i in range(1, k + 1))
    return (tokens - 1) / k


SOLUTIONS = {"15.1": solve_15_1, "15.2": solve_15_2, "15.3": solve_15_3}
WRONG = {"15.1": 3.5, "15.2": 1, "15.3": 0.6}
