"""Worked solutions for notebook 03 (dynamic batching), found with batchlab's simulator."""

from batchlab.analysis import metrics
from batchlab.analysis.batches import batches_df
from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.schedulers import DynamicBatcher, StaticBatcher
from batchlab.workloads import make_workload
from batchlab.workloads.scripted import scripted_workload


def _steps_of(seconds: float) -> SimBackend:
    """A simulated device on which every step takes exactly ``seconds``."""
    cost = CostModel(fixed_s=seconds, per_seq_s=0.0, per_token_s=0.0, per_attention_pair_s=0.0)
    return SimBackend(cost, kv_capacity_tokens=1 << 20)


def solve_03_1() -> list[float]:
    """One-token requests make one step per batch, so a 1.0 s step is a 1.0 s batch.
    By hand: the third arrival fills a batch at 0.25 s (before the 0.4 s timer). The 4th (0.3 s)
    and 5th (0.9 s) arrive while it runs; the 4th's timer ran out at 0.7 s, so both leave the
    moment the server is free, at 1.25 s. The 6th (2.0 s) arrives to an idle server and starts a
    timer; the 7th joins; they leave at 2.4 s: [0.25, 0.25, 0.25, 1.25, 1.25, 2.4, 2.4]."""
    requests = scripted_workload([0.0, 0.2, 0.25, 0.3, 0.9, 2.0, 2.05], max_new_tokens=1)
    trace = Engine(DynamicBatcher(3, 0.4), _steps_of(1.0)).run(requests)
    return trace.requests_df()["first_scheduled_time"].tolist()


def solve_03_2() -> float:
    """By hand: 1 (the request that starts the timer) + 20/s * 0.2 s = 5. The simulator, with
    1 ms steps (an idle server) and a batch limit far away, measures about the same."""
    requests = make_workload(4000, prompt_len=8, output_len=1, arrival="poisson", rate=20.0, seed=0)
    trace = Engine(DynamicBatcher(1000, 0.2), _steps_of(0.001)).run(requests)
    return float(batches_df(trace)["size"].mean())


def solve_03_3() -> float:
    """Sorted: [5, 8, 10, 20] and [250, 300, 400, 500]; held 15+12+10+0 + 250+200+100+0 = 587
    slot-steps of 4*20 + 4*500 = 2080."""
    lens = sorted([5, 400, 10, 300, 20, 500, 8, 250])
    requests = scripted_workload([0.0] * len(lens), max_new_tokens=lens)
    trace = Engine(StaticBatcher(4), _steps_of(0.01)).run(requests)
    return metrics.slot_waste(trace)


SOLUTIONS = {"03.1": solve_03_1, "03.2": solve_03_2, "03.3": solve_03_3}
WRONG = {
    "03.1": [0.25, 0.25, 0.25, 0.7, 1.3, 2.4, 2.4],  # timers that ignore the busy server
    "03.2": 4.0,                                    # forgets the request that started the timer
    "03.3": 0.5853,                                 # the waste in arrival order, unsorted
}
