"""Worked solutions for notebook 02 (static batching), found with batchlab's simulator."""

import numpy as np

from batchlab.analysis import metrics
from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.schedulers import StaticBatcher
from batchlab.workloads import make_workload
from batchlab.workloads.scripted import scripted_workload


def _steps_of(fixed_s: float, per_seq_s: float = 0.0) -> SimBackend:
    cost = CostModel(fixed_s=fixed_s, per_seq_s=per_seq_s, per_token_s=0.0, per_attention_pair_s=0.0)
    return SimBackend(cost, kv_capacity_tokens=1 << 16)


def solve_02_1() -> float:
    """By hand: request i of 8 waits (7 - i) gaps of 0.5 s; the mean of 3.5, 3.0, ... 0 is 1.75.
    The simulator agrees: the queue time is the wait before the batch starts."""
    requests = scripted_workload([0.5 * i for i in range(8)], max_new_tokens=4)
    trace = Engine(StaticBatcher(8), _steps_of(0.05)).run(requests)
    return float(metrics.per_request_metrics(trace)["queue_time"].mean())


def solve_02_2() -> float:
    """By hand: 48 steps x 6 slots = 288 slot-steps; five requests hold 44 each: 220 / 288."""
    requests = scripted_workload([0.0] * 6, max_new_tokens=[4, 4, 4, 4, 4, 48])
    trace = Engine(StaticBatcher(6), _steps_of(0.05)).run(requests)
    return metrics.slot_waste(trace)


def solve_02_3() -> float:
    """By hand: alone, 64 * 32 steps of 45 ms; batched, 4 * 32 steps of 120 ms: ratio 6.0."""
    job = make_workload(64, prompt_len=32, output_len=32, arrival="at_once")
    rates = [metrics.throughput(Engine(StaticBatcher(b), _steps_of(0.040, 0.005)).run(job))
             ["output_throughput"] for b in (1, 16)]
    return float(np.float64(rates[1]) / np.float64(rates[0]))


SOLUTIONS = {"02.1": solve_02_1, "02.2": solve_02_2, "02.3": solve_02_3}
WRONG = {
    "02.1": 3.5,          # the first request's wait, not the mean (and with 1 s gaps)
    "02.2": 5 / 6,        # five of six slots, forgetting they were busy for their first 4 steps
    "02.3": 16.0,         # as if a step for 16 cost the same as a step for 1
}
