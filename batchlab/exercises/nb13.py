"""Checkers for notebook 13 (tuning vLLM): a prefix cache's block arithmetic, and a knob's
effect predicted on the simulator before it is measured."""

from __future__ import annotations

from functools import lru_cache

from batchlab.backends.cost_model import CostModel
from batchlab.exercises import Verdict, call_reader, compare, exercise, not_a_function
from batchlab.loadgen.client import LoadRequest
from batchlab.loadgen.predict import load_figures, simulate_load

# The cases 13.1 is checked on: (prompt_len, shared_len, block_size).
HIT_CASES = [(416, 384, 128), (400, 400, 128), (384, 384, 128), (129, 400, 128), (100, 64, 16),
             (17, 17, 16), (600, 300, 128), (1, 1, 16), (256, 255, 16), (1000, 1000, 16)]


def expected_hit_tokens(prompt_len: int, shared_len: int, block_size: int) -> int:
    """Whole cached blocks of the shared prefix, but never the prompt's last token (it must be
    computed to produce the first output token)."""
    return (min(shared_len, prompt_len - 1) // block_size) * block_size


@exercise("13.1")
def check_hit_tokens(answer) -> Verdict:
    """``answer(prompt_len, shared_len, block_size)`` -> int: prompt tokens the cache serves."""
    if (v := not_a_function(answer, "check('13.1', hit_tokens)")) is not None:
        return v
    for case in HIT_CASES:
        got, error = call_reader(answer, *case)
        if error:
            return Verdict("wrong", f"hit_tokens{case}: {error}")
        expected = expected_hit_tokens(*case)
        if got != expected:
            return Verdict("wrong", f"hit_tokens(prompt_len={case[0]}, shared_len={case[1]}, block_size={case[2]}) "
                                    f"is {expected}; you returned {got!r} (only whole blocks are cached, and "
                                    "the prompt's last token is always computed)")
    return Verdict("correct", f"right on all {len(HIT_CASES)} cases, the last-token rule included")


# --- 13.2 ----------------------------------------------------------------------------------------
CHECK_COST = CostModel(0.048, 0.0005, 0.0022, 1e-6, source="13.2's checker")


@lru_cache(maxsize=1)
def checker_load() -> tuple[LoadRequest, ...]:
    """16 requests of 48-token prompts and 24 output tokens, arriving every 0.2 s."""
    return tuple(LoadRequest(f"x{i}", [100 + (7 * i + j) % 900 for j in range(48)], 24, arrival_time=0.2 * i)
                 for i in range(16))


def expected_throughput(cost, requests, max_num_seqs: int) -> float:
    return load_figures(simulate_load(cost, list(requests), max_num_seqs=max_num_seqs))["output_tok_s"]


@exercise("13.2")
def check_predicted_throughput(answer) -> Verdict:
    """``answer(cost, requests, max_num_seqs)`` -> float: predicted output tokens/s."""
    if (v := not_a_function(answer, "check('13.2', predicted_throughput)")) is not None:
        return v
    requests = list(checker_load())
    for k in (1, 3, 16):
        got, error = call_reader(answer, CHECK_COST, requests, k)
        if error:
            return Verdict("wrong", f"max_num_seqs={k}: {error}")
        v = compare(got, expected_throughput(CHECK_COST, requests, k), rtol=1e-6,
                    what=f"output tokens/s at max_num_seqs={k}")
        if not v.ok:
            return Verdict("wrong", v.message + " (simulate the load with the given max_num_seqs and vLLM's "
                                                "other defaults, then read load_figures(...)['output_tok_s'])")
    return Verdict("correct", "predicted throughput matches at max_num_seqs 1, 3 and 16")
