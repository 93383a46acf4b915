"""Checkers for notebook 08 (load, tails, and who wins).

08.1 and 08.2 are computed by arithmetic from the cost formula, independently of the schedulers
the notebook uses to find them; 08.3 has no closed form, so its checker serves the workload on
the simulator with a plain engine loop (not ``load_sweep``).
"""

from __future__ import annotations

import math
from functools import lru_cache

from batchlab.exercises import Verdict, compare, exercise

# The exercises' GPU-like cost model (the same numbers as the notebook's ``gpu_like``).
GPU_LIKE = dict(fixed_s=0.006, per_seq_s=1e-4, per_token_s=2e-5, per_attention_pair_s=1e-9)
# 08.1 / 08.2: a lone request on an idle server.
PROMPT_LEN_1, BUDGET_1, TIMEOUT_1 = 4096, 512, 0.002
# 08.3: a goodput sweep of continuous batching.
RATES_3 = (20, 40, 60, 80, 100, 120)
NUM_REQUESTS_3, SEED_3 = 400, 7
SLO_TTFT_3, SLO_TPOT_3 = 0.1, 0.02


def _step_s(num_seqs: int, num_tokens: int, attention_pairs: int) -> float:
    c = GPU_LIKE
    return (c["fixed_s"] + c["per_seq_s"] * num_seqs + c["per_token_s"] * num_tokens
            + c["per_attention_pair_s"] * attention_pairs)


def _pairs(start: int, n: int) -> int:
    """Query-key pairs of tokens [start, start + n): each attends to itself and all before it."""
    return n * start + n * (n + 1) // 2


def _lone_ttfts() -> tuple[float, float, float]:
    """(continuous TTFT, one whole-prompt step, dynamic TTFT) for the lone request of 08.1."""
    chunks = [(start, min(BUDGET_1, PROMPT_LEN_1 - start)) for start in range(0, PROMPT_LEN_1, BUDGET_1)]
    continuous = sum(_step_s(1, n, _pairs(start, n)) for start, n in chunks)
    whole_prompt = _step_s(1, PROMPT_LEN_1, _pairs(0, PROMPT_LEN_1))
    return continuous, whole_prompt, TIMEOUT_1 + whole_prompt


@exercise("08.1")
def check_lone_advantage(answer) -> Verdict:
    """ceil(P / B) chunk steps against the timeout plus one whole-prompt step."""
    continuous, _, dynamic = _lone_ttfts()
    return compare(answer, continuous - dynamic, rtol=1e-3, what="TTFT difference (s)")


@exercise("08.2")
def check_break_even_timeout(answer) -> Verdict:
    """Dynamic ties when timeout + whole-prompt step == the chunked prefill's total."""
    continuous, whole_prompt, _ = _lone_ttfts()
    return compare(answer, continuous - whole_prompt, rtol=1e-3, what="longest timeout (s)")


@lru_cache(maxsize=1)
def _best_goodput_rate() -> float:
    from batchlab.analysis.metrics import SLO, goodput
    from batchlab.backends import SimBackend
    from batchlab.backends.cost_model import CostModel
    from batchlab.engine import Engine
    from batchlab.schedulers import ContinuousBatcher
    from batchlab.workloads import make_workload

    cost = CostModel(**GPU_LIKE)
    slo = SLO(ttft=SLO_TTFT_3, tpot=SLO_TPOT_3)
    best_rate, best = math.nan, -1.0
    for rate in RATES_3:
        requests = make_workload(NUM_REQUESTS_3, "chat", arrival="poisson", rate=rate, seed=SEED_3)
        trace = Engine(ContinuousBatcher(max_num_seqs=16, max_num_batched_tokens=256),
                       SimBackend(cost, kv_capacity_tokens=16 * 512)).run(requests)
        good = goodput(trace, slo)
        if good > best:
            best_rate, best = float(rate), good
    return best_rate


@exercise("08.3")
def check_best_goodput_rate(answer) -> Verdict:
    """The swept rate with the highest goodput, found by serving each rate on the simulator."""
    return compare(answer, _best_goodput_rate(), what="rate (req/s)")
