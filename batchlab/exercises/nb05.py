"""Checkers for notebook 05 (the memory that caps the batch).

05.1 and 05.2 compute the answer from the shapes with plain arithmetic written here; 05.3 runs
the paged simulator on the exercise's two requests, so the answer follows batchlab's rules.
"""

from __future__ import annotations

from batchlab.exercises import Verdict, compare, exercise

# 05.1: Llama-3-70B's KV shape in bf16.
LAYERS_1, KV_HEADS_1, HEAD_DIM_1, BYTES_1 = 80, 8, 128, 2
# 05.2: Llama-3-8B in bf16, a 10 GiB budget, blocks of 16, sequences of 3,000 tokens.
LLAMA3_8B_TOKEN_BYTES = 2 * 32 * 8 * 128 * 2
BUDGET_2, BLOCK_2, CONTEXT_2 = 10 * 2**30, 16, 3000
# 05.3: 4 blocks of 4 tokens; A (prompt 6, 6 new) and B (prompt 2, 10 new) at t = 0; 1 s steps.
BLOCKS_3, BLOCK_3 = 4, 4
REQUESTS_3 = (("A", 6, 6), ("B", 2, 10))


@exercise("05.1")
def check_bytes_per_token(answer) -> Verdict:
    """Bytes of one token's KV: a key and a value per layer and KV head."""
    return compare(answer, 2 * LAYERS_1 * KV_HEADS_1 * HEAD_DIM_1 * BYTES_1, what="bytes per token")


@exercise("05.2")
def check_sequences_at_once(answer) -> Verdict:
    """Whole blocks in the budget, over whole blocks per sequence."""
    blocks = BUDGET_2 // (LLAMA3_8B_TOKEN_BYTES * BLOCK_2)
    per_sequence = -(-CONTEXT_2 // BLOCK_2)
    return compare(answer, blocks // per_sequence, what="sequences")


def _preemption_scenario() -> dict:
    from batchlab.sim import SimBackend
    from batchlab.steptime.cost_model import CostModel
    from batchlab.engine import Engine
    from batchlab.requests import Request
    from batchlab.schedulers import ContinuousBatcher

    one_second = CostModel(fixed_s=1.0, per_seq_s=0.0, per_token_s=0.0, per_attention_pair_s=0.0)
    backend = SimBackend(one_second, BLOCKS_3 * BLOCK_3, block_size=BLOCK_3)
    requests = [Request(rid, None, out, prompt_len=p) for rid, p, out in REQUESTS_3]
    trace = Engine(ContinuousBatcher(max_num_seqs=8, max_num_batched_tokens=64),
                   backend).run(requests)
    if len(trace.preemptions) != 1:
        raise AssertionError("the scenario should preempt once, not "
                             f"{len(trace.preemptions)} times")
    p = trace.preemptions[0]
    return {"preempted": p.request_id, "at": p.time,
            **{r.request_id: r.token_times[-1] for r in trace.requests}}


@exercise("05.3")
def check_preemption(answer) -> Verdict:
    """Who is preempted, when, and when each request finishes (seconds)."""
    if answer is None or answer is ...:
        return compare(answer, 0)
    expected = _preemption_scenario()
    if not isinstance(answer, dict) or set(answer) != set(expected):
        return Verdict("wrong", f"give a dict with the keys {sorted(expected)}")
    wrong = [k for k in expected if answer[k] != expected[k]]
    if wrong:
        return Verdict("wrong", f"these entries are not right: {wrong}")
    return Verdict("correct", "the preemption and both finish times match")
