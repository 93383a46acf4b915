"""Checkers for notebook 13 (tuning vLLM): a prefix cache's block arithmetic, and the smallest
``--max-num-seqs`` the simulator predicts to keep up with a load."""

from __future__ import annotations

from functools import lru_cache

from batchlab.steptime.cost_model import CostModel
from batchlab.engine_args import EngineArgs
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
            return Verdict("wrong", f"hit_tokens(prompt_len={case[0]}, shared_len={case[1]}, "
                                    f"block_size={case[2]}) is {expected}; you returned {got!r} "
                                    "(only whole blocks are cached, and the prompt's last token "
                                    "is always computed)")
    return Verdict("correct", f"right on all {len(HIT_CASES)} cases, the last-token rule included")


# --- 13.2 ---------------------------------------------------------------------------------------
CANDIDATES = (1, 2, 4, 8, 16, 32, 64, 128)
CHECK_COST = CostModel(0.048, 0.0005, 0.0022, 1e-6, source="13.2's checker")
SLOW_COST = CostModel(0.030, 0.004, 0.0030, 1e-6, source="13.2's checker: a dearer sequence")


@lru_cache(maxsize=8)
def checker_load(num_requests: int, rate: float) -> tuple[LoadRequest, ...]:
    """Requests of 48-token prompts and 24 output tokens, arriving ``rate`` a second."""
    return tuple(LoadRequest(f"x{i}", [100 + (7 * i + j) % 900 for j in range(48)], 24,
                             arrival_time=i / rate)
                 for i in range(num_requests))


# The cases 13.2 is checked on: (cost model, requests, arrival rate, share of 128's throughput); the
# answers are 16, 64, 16, 32, 2 and 1.
SEQS_CASES = [(CHECK_COST, 16, 5.0, 0.95), (CHECK_COST, 48, 10.0, 0.95),
              (CHECK_COST, 48, 10.0, 0.8),
              (SLOW_COST, 48, 10.0, 0.95), (CHECK_COST, 16, 1.0, 0.95), (SLOW_COST, 16, 1.0, 0.95)]


def predicted_throughput(cost, requests, max_num_seqs: int) -> float:
    return load_figures(simulate_load(cost, list(requests),
                                      EngineArgs(max_num_seqs=max_num_seqs)))["output_tok_s"]


@lru_cache(maxsize=16)
def expected_seqs(cost, num_requests: int, rate: float, share: float) -> int:
    """The smallest of ``CANDIDATES`` predicted to reach ``share`` of the largest one's output
    tokens/s."""
    requests = checker_load(num_requests, rate)
    tput = {k: predicted_throughput(cost, requests, k) for k in CANDIDATES}
    return min(k for k in CANDIDATES if tput[k] >= share * tput[max(CANDIDATES)])


@exercise("13.2")
def check_seqs_to_keep_up(answer) -> Verdict:
    """``answer(cost, requests, share)`` -> int: the smallest max_num_seqs predicted to keep up."""
    if (v := not_a_function(answer, "check('13.2', seqs_to_keep_up)")) is not None:
        return v
    for cost, num_requests, rate, share in SEQS_CASES:
        expected = expected_seqs(cost, num_requests, rate, share)
        got, error = call_reader(answer, cost, list(checker_load(num_requests, rate)), share)
        where = f"{num_requests} requests at {rate:g}/s, share={share:g}, {cost}"
        if error:
            return Verdict("wrong", f"{where}: {error}")
        if got != expected:
            return Verdict("wrong", f"{where}: the smallest setting predicted to reach {share:.0%} "
                                    f"of max_num_seqs 128's output tokens/s is {expected}; you "
                                    f"returned {got!r} (compare every candidate with 128's "
                                    "throughput, not with the one before it)")
    return Verdict("correct", f"right on all {len(SEQS_CASES)} loads and cost models")
