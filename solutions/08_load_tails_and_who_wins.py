"""Worked solutions for notebook 08 (load, tails, and who wins), found with batchlab's simulator."""

from batchlab.analysis import metrics
from batchlab.backends import SimBackend
from batchlab.backends.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.experiments.sweeps import load_sweep
from batchlab.schedulers import ContinuousBatcher, DynamicBatcher
from batchlab.workloads import make_workload
from batchlab.workloads.scripted import scripted_workload

GPU_LIKE = CostModel(fixed_s=0.006, per_seq_s=1e-4, per_token_s=2e-5, per_attention_pair_s=1e-9,
                     source="exercise: GPU-like")


def _lone_ttft(scheduler) -> float:
    """TTFT of one request with a 4,096-token prompt, alone on an idle simulated server."""
    alone = scripted_workload([0.0], max_new_tokens=8, prompt_len=4096)
    trace = Engine(scheduler, SimBackend(GPU_LIKE, kv_capacity_tokens=8192)).run(alone)
    return float(metrics.per_request_metrics(trace)["ttft"].iloc[0])


def solve_08_1() -> float:
    """By hand: 8 chunks of 512 cost 7 extra (fixed + per-seq) = 7 * 6.1 ms = 42.7 ms more than one
    whole-prompt step (the tokens and attention pairs add up to the same); minus the 2 ms timeout:
    dynamic batching is 40.7 ms sooner."""
    continuous = _lone_ttft(ContinuousBatcher(max_num_seqs=16, max_num_batched_tokens=512))
    dynamic = _lone_ttft(DynamicBatcher(max_batch_size=16, timeout=0.002, stream=True))
    return continuous - dynamic


def solve_08_2() -> float:
    """The break-even timeout is the chunked prefill's extra cost: 7 * 6.1 ms = 42.7 ms. Measured as
    continuous TTFT minus dynamic TTFT with no timeout (one whole-prompt step)."""
    continuous = _lone_ttft(ContinuousBatcher(max_num_seqs=16, max_num_batched_tokens=512))
    whole_prompt = _lone_ttft(DynamicBatcher(max_batch_size=16, timeout=0.0, stream=True))
    return continuous - whole_prompt


def solve_08_3() -> float:
    """A goodput sweep: goodput follows the rate up to 60 req/s, then TTFT queueing makes it fall
    although throughput keeps rising to about 67 req/s."""
    table = load_sweep(
        lambda rate: make_workload(400, "chat", arrival="poisson", rate=rate, seed=7),
        [20, 40, 60, 80, 100, 120],
        {"continuous": lambda: ContinuousBatcher(max_num_seqs=16, max_num_batched_tokens=256)},
        lambda: SimBackend(GPU_LIKE, kv_capacity_tokens=16 * 512),
        slo=metrics.SLO(ttft=0.1, tpot=0.02), progress=False)
    return float(table.loc[table["goodput"].idxmax(), "request_rate"])


SOLUTIONS = {"08.1": solve_08_1, "08.2": solve_08_2, "08.3": solve_08_3}
WRONG = {
    "08.1": -0.002,   # as if the chunks cost nothing extra: dynamic only loses its timeout
    "08.2": 0.0061,   # one chunk's overhead instead of seven
    "08.3": 120.0,    # the rate with the highest throughput, not the highest goodput
}
