"""Worked solutions for notebook 05 (the memory that caps the batch)."""

from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.requests import Request
from batchlab.schedulers import ContinuousBatcher
from batchlab.shapes import kv_bytes_per_token, model_shape


def solve_05_1() -> int:
    """2 (key and value) x 80 layers x 8 KV heads x 128 numbers x 2 bytes = 327,680 bytes."""
    return kv_bytes_per_token(num_layers=80, num_kv_heads=8, head_dim=128, dtype_bytes=2)


def solve_05_2() -> int:
    """10 GiB / (128 KiB x 16) = 5,120 blocks; 3,000 tokens need 188 blocks; 5,120 // 188 = 27."""
    return model_shape("Llama-3-8B").max_concurrency(10 * 2**30, 3000, block_size=16)


def solve_05_3() -> dict:
    """By hand: t=0 A takes 2 blocks (6 tokens), B 1 (2 tokens); 1 block free. At t=3 A needs a
    third block for position 8 and takes the free one; B needs a second block for position 4,
    none is free, and B is itself the most recently admitted: B is preempted at t=3 (4 tokens
    computed, 3 generated). B's 5 known tokens need 2 blocks, but only 1 is free until A finishes
    at t=6 (its 6th token). B is recomputed in one step from t=6 (its 4th token at t=7) and makes
    its 10th token at t=13."""
    one_second = CostModel(fixed_s=1.0, per_seq_s=0.0, per_token_s=0.0, per_attention_pair_s=0.0)
    requests = [Request("A", None, 6, prompt_len=6), Request("B", None, 10, prompt_len=2)]
    trace = Engine(ContinuousBatcher(8, 64), SimBackend(one_second, 16, block_size=4)).run(requests)
    (p,) = trace.preemptions
    return {"preempted": p.request_id, "at": p.time, "A": trace.requests[0].token_times[-1],
            "B": trace.requests[1].token_times[-1]}


SOLUTIONS = {"05.1": solve_05_1, "05.2": solve_05_2, "05.3": solve_05_3}
WRONG = {
    "05.1": 163_840,                                       # the key alone, without the value
    "05.2": 25,                  # 10 GiB taken as 10e9 bytes: 4,768 blocks // 188
    "05.3": {"preempted": "A", "at": 3.0, "A": 9.0, "B": 10.0},   # the oldest request preempted
}
