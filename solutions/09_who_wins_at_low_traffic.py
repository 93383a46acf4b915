"""Worked solutions for notebook 09 (who wins at low traffic), found with batchlab's simulator."""

from batchlab.analysis import metrics
from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.steptime.roofline import RooflineCostModel
from batchlab.engine import Engine
from batchlab.schedulers import ContinuousBatcher, DynamicBatcher
from batchlab.workloads.scripted import scripted_workload

GPU_LIKE = CostModel(fixed_s=0.006, per_seq_s=1e-4, per_token_s=2e-5, per_attention_pair_s=1e-9,
                     source="exercise: GPU-like")
H100_8B = RooflineCostModel.for_device("Llama-3-8B", "H100", overhead_s=0.002, grounded=False)  # the datasheet roofline


def _lone_ttft(scheduler, cost_model=GPU_LIKE) -> float:
    """TTFT of one request with a 4,096-token prompt, alone on an idle simulated server."""
    alone = scripted_workload([0.0], max_new_tokens=8, prompt_len=4096)
    trace = Engine(scheduler, SimBackend(cost_model, kv_capacity_tokens=8192)).run(alone)
    return float(metrics.per_request_metrics(trace)["ttft"].iloc[0])


def solve_09_1() -> float:
    """By hand: 8 chunks of 512 cost 7 extra (fixed + per-seq) = 7 * 6.1 ms = 42.7 ms more than one
    whole-prompt step (the tokens and attention pairs add up to the same); minus the 2 ms timeout:
    dynamic batching is 40.7 ms sooner."""
    continuous = _lone_ttft(ContinuousBatcher(max_num_seqs=16, max_num_batched_tokens=512))
    dynamic = _lone_ttft(DynamicBatcher(max_batch_size=16, timeout=0.002, stream=True))
    return continuous - dynamic


def solve_09_2() -> float:
    """The break-even timeout is the chunked prefill's extra cost: 7 * 6.1 ms = 42.7 ms. Measured as
    continuous TTFT minus dynamic TTFT with no timeout (one whole-prompt step)."""
    continuous = _lone_ttft(ContinuousBatcher(max_num_seqs=16, max_num_batched_tokens=512))
    whole_prompt = _lone_ttft(DynamicBatcher(max_batch_size=16, timeout=0.0, stream=True))
    return continuous - whole_prompt


def solve_09_3() -> float:
    """32 chunks of 128 tokens, each memory-bound: each reads all 15 GB of weights (4.5 ms) plus
    the overhead, about 0.21 s in all; the whole prompt in one compute-bound step takes about
    0.07 s. Dynamic batching is about 0.14 s sooner: below the ridge point a GPU pays a weight
    read per chunk, as a CPU does."""
    continuous = _lone_ttft(ContinuousBatcher(max_num_seqs=16, max_num_batched_tokens=128), H100_8B)
    dynamic = _lone_ttft(DynamicBatcher(max_batch_size=16, timeout=0.003, stream=True), H100_8B)
    return continuous - dynamic


SOLUTIONS = {"09.1": solve_09_1, "09.2": solve_09_2, "09.3": solve_09_3}
WRONG = {
    "09.1": -0.002,   # as if the chunks cost nothing extra: dynamic only loses its timeout
    "09.2": 0.0061,   # one chunk's overhead instead of seven
    "09.3": 0.059,    # 31 overheads less the timeout: as if 128-token chunks were compute-bound
}
