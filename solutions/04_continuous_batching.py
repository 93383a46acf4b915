"""Worked solutions for notebook 04 (continuous batching), found with batchlab's simulator."""

from batchlab.analysis.metrics import summarize
from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.schedulers import ContinuousBatcher, StaticBatcher
from batchlab.workloads import Range, make_workload
from batchlab.workloads.scripted import scripted_workload

OUTPUT_LENS = [3, 1, 4, 1, 5]


def _one_second_steps() -> SimBackend:
    """A simulated device on which every step takes exactly 1 s, so times count steps."""
    cost = CostModel(fixed_s=1.0, per_seq_s=0.0, per_token_s=0.0, per_attention_pair_s=0.0)
    return SimBackend(cost, kv_capacity_tokens=1 << 20)


def solve_04_1() -> list[int]:
    """By hand, with 2 slots: step 0 runs A and B; B (1 token) leaves. Step 1: C joins; A makes
    its 2nd token. Step 2: A's 3rd, A leaves. Step 3: D joins and leaves. Step 4: E joins, C's
    4th token, C leaves. Steps 5-8: E alone. So [2, 0, 4, 3, 8].
    On the simulator a step lasts 1 s, so the last token's time minus 1 is its step."""
    requests = scripted_workload([0.0] * 5, max_new_tokens=OUTPUT_LENS)
    trace = Engine(ContinuousBatcher(max_num_seqs=2), _one_second_steps()).run(requests)
    return [round(r.token_times[-1]) - 1 for r in trace.requests]


def solve_04_2() -> int:
    """Batches {3, 1}, {4, 1}, {5}: B holds its slot 2 steps, D 3 steps, E nobody: 5.
    The simulator's steps record the held slots directly."""
    requests = scripted_workload([0.0] * 5, max_new_tokens=OUTPUT_LENS)
    trace = Engine(StaticBatcher(batch_size=2), _one_second_steps()).run(requests)
    return sum(step.held_slots for step in trace.steps)


def solve_04_3() -> int:
    """Try each max_num_seqs from 1 up and stop at the first that meets the target."""
    cost = CostModel(fixed_s=0.040, per_seq_s=0.004, per_token_s=0.0006, per_attention_pair_s=2e-8)
    requests = make_workload(300, "mixed_output", output_len=Range(4, 48), arrival="poisson",
                             rate=2.0, seed=0)
    for max_num_seqs in range(1, 17):
        trace = Engine(ContinuousBatcher(max_num_seqs=max_num_seqs),
                       SimBackend(cost, kv_capacity_tokens=1 << 20)).run(requests)
        if summarize(trace).loc["ttft", "p99"] <= 1.0:
            return max_num_seqs
    raise AssertionError("no max_num_seqs in 1..16 meets the target")


SOLUTIONS = {"04.1": solve_04_1, "04.2": solve_04_2, "04.3": solve_04_3}
WRONG = {
    "04.1": [2, 0, 5, 4, 9],   # a freed slot reused one step late
    "04.2": 0,                 # as if static batching freed slots like continuous batching
    "04.3": 8,                 # the usual default, without checking the target
}
