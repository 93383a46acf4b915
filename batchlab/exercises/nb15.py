"""Checkers for notebook 15 (speculative decoding and the batch).

15.1 and 15.3 are formulas (instant); 15.2 runs the GPU simulator over five batch sizes (about a
second, once per session: cached).
"""

from __future__ import annotations

from functools import lru_cache

from batchlab.exercises import Verdict, compare, exercise

MODEL, GPU = "Llama-3-8B", "H100"
BATCHES = (1, 8, 32, 128, 512)


def tokens_per_check(alpha: float = 0.7, k: int = 4) -> float:
    """15.1: tokens a check of ``k`` drafts emits on average, each accepted with chance
    ``alpha``."""
    from batchlab.speculative import expected_accepted
    return 1 + expected_accepted(alpha, k)


def break_even_pass_cost(alpha: float = 0.6, k: int = 3) -> float:
    """15.3: the largest cost of one draft pass, as a share of a plain step, at which a check of
    ``k`` drafts (each accepted with chance ``alpha``) still pays:
    ``1 + k·c < tokens per check``."""
    return (tokens_per_check(alpha, k) - 1) / k


@lru_cache(maxsize=1)
def first_losing_batch() -> int | None:
    """15.2: the first of ``BATCHES`` at which prompt lookup with k = 3 and a 0.5 acceptance rate
    no longer pays for Llama-3-8B on an H100 (vLLM's step model)."""
    from batchlab.sim import SimBackend
    from batchlab.experiments.speculation import crossover, serve_batches
    from batchlab.requests import Request
    from batchlab.speculative import AcceptanceModel, SpeculativeConfig
    from batchlab.vllm_sim import VllmReplica
    cost, acceptance = VllmReplica(MODEL, GPU).step_model, AcceptanceModel(0.5)
    spec = SpeculativeConfig(3, method="ngram")

    def backend(config, batch):
        return SimBackend(cost, 10**7, block_size=16, speculative_config=config,
                          acceptance=acceptance if config else None)

    table, _ = serve_batches(backend, lambda n: [Request(f"r{i}", None, 128, prompt_len=512)
                                                 for i in range(n)],
                             BATCHES, {"none": None, "ngram": spec}, min_requests=4)
    return crossover(table, "ngram")


@exercise("15.1")
def check_15_1(answer) -> Verdict:
    return compare(answer, tokens_per_check(), rtol=0.01, what="tokens per check")


@exercise("15.2")
def check_15_2(answer) -> Verdict:
    if answer is None or answer is ...:
        return Verdict("not attempted",
                       "set answer to a batch size from the list and run the cell again")
    if answer not in BATCHES:
        return Verdict("wrong", f"expected one of {list(BATCHES)}, got {answer!r}")
    best = first_losing_batch()
    return (Verdict("correct", f"from batch {best} on it costs more than it saves")
            if answer == best else
            Verdict("wrong",
                    f"speculation {'still pays' if answer < best else 'already loses before'} "
                    f"at batch {answer}"))


@exercise("15.3")
def check_15_3(answer) -> Verdict:
    return compare(answer, break_even_pass_cost(), rtol=0.01,
                   what="the break-even cost of a draft pass")
