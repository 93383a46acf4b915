"""Checkers for notebook 09 (who wins at low traffic).

Every answer is a lone request on an idle server, so each is computed by arithmetic from the
cost formula (the additive one for 09.1 and 09.2, the roofline for 09.3), independently of the
schedulers and the simulator the notebook uses to find them.
"""

from __future__ import annotations

from batchlab.exercises import Verdict, compare, exercise

# The exercises' GPU-like cost model (the same numbers as the notebook's ``gpu_like``).
GPU_LIKE = dict(fixed_s=0.006, per_seq_s=1e-4, per_token_s=2e-5, per_attention_pair_s=1e-9)
# 09.1 / 09.2: a lone request on an idle server.
PROMPT_LEN, BUDGET_1, TIMEOUT_1 = 4096, 512, 0.002
# 09.3: the roofline preset with a budget below the ridge point.
SHAPE_3, DEVICE_3, OVERHEAD_3, BUDGET_3, TIMEOUT_3 = "Llama-3-8B", "H100", 0.002, 128, 0.003


def _pairs(start: int, n: int) -> int:
    """Query-key pairs of tokens [start, start + n): each attends to itself and all before it."""
    return n * start + n * (n + 1) // 2


def _chunks(budget: int) -> list[tuple[int, int]]:
    return [(start, min(budget, PROMPT_LEN - start)) for start in range(0, PROMPT_LEN, budget)]


def _additive_s(num_seqs: int, num_tokens: int, attention_pairs: int) -> float:
    c = GPU_LIKE
    return (c["fixed_s"] + c["per_seq_s"] * num_seqs + c["per_token_s"] * num_tokens
            + c["per_attention_pair_s"] * attention_pairs)


def _roofline_s(num_seqs: int, num_tokens: int, attention_pairs: int) -> float:
    """max(bytes / bandwidth, FLOPs / peak) + overhead, from the shape and the datasheet numbers."""
    from batchlab.steptime.roofline import device_preset, model_shape

    shape, device = model_shape(SHAPE_3), device_preset(DEVICE_3)
    b = device.dtype_bytes
    # one key read per query tile
    keys = attention_pairs / min(128, max(1.0, num_tokens / num_seqs))
    memory = ((shape.matmul_params * b + keys * shape.kv_bytes_per_token(b))
              / device.memory_bandwidth_Bps)
    compute = (2 * shape.matmul_params * num_tokens
               + shape.attention_flops_per_pair * attention_pairs) / device.peak_flops
    return max(memory, compute) + OVERHEAD_3


def _lone(step_s, budget: int, timeout: float) -> tuple[float, float, float]:
    """(continuous TTFT, one whole-prompt step, dynamic TTFT) for the lone request."""
    continuous = sum(step_s(1, n, _pairs(start, n)) for start, n in _chunks(budget))
    whole_prompt = step_s(1, PROMPT_LEN, _pairs(0, PROMPT_LEN))
    return continuous, whole_prompt, timeout + whole_prompt


@exercise("09.1")
def check_lone_advantage(answer) -> Verdict:
    """ceil(P / B) chunk steps against the timeout plus one whole-prompt step."""
    continuous, _, dynamic = _lone(_additive_s, BUDGET_1, TIMEOUT_1)
    return compare(answer, continuous - dynamic, rtol=1e-3, what="TTFT difference (s)")


@exercise("09.2")
def check_break_even_timeout(answer) -> Verdict:
    """Dynamic ties when timeout + whole-prompt step == the chunked prefill's total."""
    continuous, whole_prompt, _ = _lone(_additive_s, BUDGET_1, TIMEOUT_1)
    return compare(answer, continuous - whole_prompt, rtol=1e-3, what="longest timeout (s)")


@exercise("09.3")
def check_memory_bound_chunks(answer) -> Verdict:
    """32 memory-bound chunks each read the weights; one whole-prompt step is compute-bound."""
    continuous, _, dynamic = _lone(_roofline_s, BUDGET_3, TIMEOUT_3)
    return compare(answer, continuous - dynamic, rtol=1e-3, what="TTFT difference (s)")
