"""Checkers for notebook 08 (load, tails, and goodput).

All three exercises come from one goodput sweep of continuous batching on the simulator with a
GPU-like cost model. The checker serves it with a plain engine loop (not ``load_sweep``) and
counts the good requests per rate itself; 08.2's interpolation is written out here too, so the
check does not rest on ``metrics.max_rate_meeting_slo``.
"""

from __future__ import annotations

from functools import lru_cache

from batchlab.exercises import Verdict, compare, exercise

# The exercises' GPU-like cost model (the same numbers as the notebook's ``gpu_like``).
GPU_LIKE = dict(fixed_s=0.006, per_seq_s=1e-4, per_token_s=2e-5, per_attention_pair_s=1e-9)
RATES = (20, 40, 60, 80, 100, 120)
NUM_REQUESTS, SEED = 400, 7
SLO_TTFT, SLO_TPOT = 0.1, 0.02
ATTAINMENT_TARGET = 0.9
ATTAINMENT_RATE = 80.0   # 08.3: the swept rate just past the goodput peak


@lru_cache(maxsize=1)
def _sweep() -> tuple[tuple[float, float, float], ...]:
    """(rate, goodput in req/s, SLO attainment) per swept rate."""
    from batchlab.analysis.metrics import benchmark_duration, per_request_metrics
    from batchlab.sim import SimBackend
    from batchlab.steptime.cost_model import CostModel
    from batchlab.engine import Engine
    from batchlab.schedulers import ContinuousBatcher
    from batchlab.workloads import make_workload

    cost = CostModel(**GPU_LIKE)
    rows = []
    for rate in RATES:
        requests = make_workload(NUM_REQUESTS, "chat", arrival="poisson", rate=rate, seed=SEED)
        trace = Engine(ContinuousBatcher(max_num_seqs=16, max_num_batched_tokens=256),
                       SimBackend(cost, kv_capacity_tokens=16 * 512)).run(requests)
        done = per_request_metrics(trace)   # finished requests; any other one misses the SLO
        good = int(((done["ttft"] <= SLO_TTFT)
                    & (done["tpot"].isna() | (done["tpot"] <= SLO_TPOT))).sum())
        rows.append((float(rate), good / benchmark_duration(trace), good / NUM_REQUESTS))
    return tuple(rows)


def _best_rate() -> float:
    """The swept rate with the highest goodput."""
    return max(_sweep(), key=lambda row: row[1])[0]


def _attainment_at(rate: float) -> float:
    return next(a for r, _, a in _sweep() if r == rate)


def _distserve_goodput() -> float:
    """The first rate whose attainment falls below the target, interpolated with the one before."""
    rows = _sweep()
    for (r0, _, a0), (r1, _, a1) in zip(rows, rows[1:]):
        if a0 >= ATTAINMENT_TARGET > a1:
            return r0 + (a0 - ATTAINMENT_TARGET) / (a0 - a1) * (r1 - r0)
    raise AssertionError("the exercise's sweep must cross the 90% target between two swept rates")


@exercise("08.1")
def check_best_goodput_rate(answer) -> Verdict:
    """The swept rate with the highest goodput, found by serving each rate on the simulator."""
    return compare(answer, _best_rate(), what="rate (req/s)")


@exercise("08.2")
def check_distserve_goodput(answer) -> Verdict:
    """The highest rate with at least 90% of requests meeting the SLO, interpolated."""
    return compare(answer, _distserve_goodput(), rtol=1e-3, what="DistServe goodput (req/s)")


@exercise("08.3")
def check_attainment_past_the_peak(answer) -> Verdict:
    """The share of requests meeting the SLO in the run at ``ATTAINMENT_RATE`` req/s."""
    return compare(answer, _attainment_at(ATTAINMENT_RATE), rtol=1e-3, what="SLO attainment")
