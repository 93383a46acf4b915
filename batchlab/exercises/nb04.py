"""Checkers for notebook 04 (continuous batching).

04.1 and 04.2 replay the scheduling rules with a few lines of plain Python written here,
independently of batchlab's schedulers; 04.3 runs the simulator with a fixed cost model, so its
answer does not depend on the machine.
"""

from __future__ import annotations

from batchlab.exercises import Verdict, compare, exercise

# 04.1 and 04.2: five requests waiting at step 0, with these output lengths.
OUTPUT_LENS = (3, 1, 4, 1, 5)
NUM_SLOTS_1 = 2
BATCH_SIZE_2 = 2
# 04.3: the simulator, the workload and the target.
COST_3 = dict(fixed_s=0.040, per_seq_s=0.004, per_token_s=0.0006, per_attention_pair_s=2e-8)
NUM_REQUESTS_3, RATE_3, SEED_3 = 300, 2.0, 0
TTFT_P99_TARGET_3 = 1.0
MAX_NUM_SEQS_CHOICES_3 = range(1, 17)


def _continuous_finish_steps(output_lens, num_slots) -> list[int]:
    """Per-step scheduling with everyone waiting at step 0: join when a slot is free, make one
    token per step (the first in the joining step), leave after the last, free the slot for the
    next step."""
    remaining = list(output_lens)
    finish = [-1] * len(remaining)
    waiting, running, step = list(range(len(remaining))), [], 0
    while waiting or running:
        while waiting and len(running) < num_slots:
            running.append(waiting.pop(0))
        for i in running:
            remaining[i] -= 1
        for i in [i for i in running if remaining[i] == 0]:
            finish[i] = step
            running.remove(i)
        step += 1
    return finish


def _static_held_slot_steps(output_lens, batch_size) -> int:
    """Batches in arrival order; a batch lasts as many steps as its longest member, and a member
    that finished earlier holds its slot for the rest."""
    held = 0
    for i in range(0, len(output_lens), batch_size):
        batch = output_lens[i:i + batch_size]
        held += sum(max(batch) - n for n in batch)
    return held


@exercise("04.1")
def check_finish_steps(answer) -> Verdict:
    """The step (from 0) in which each request makes its last token, in request order."""
    return compare(answer, _continuous_finish_steps(OUTPUT_LENS, NUM_SLOTS_1),
                   what="finish steps")


@exercise("04.2")
def check_held_slot_steps(answer) -> Verdict:
    """Slot-steps held by finished members under static batching."""
    return compare(answer, _static_held_slot_steps(OUTPUT_LENS, BATCH_SIZE_2),
                   what="held slot-steps")


@exercise("04.3")
def check_smallest_max_num_seqs(answer) -> Verdict:
    """The smallest max_num_seqs whose p99 TTFT meets the target, found by trying each."""
    from batchlab.analysis.metrics import summarize
    from batchlab.sim import SimBackend
    from batchlab.steptime.cost_model import CostModel
    from batchlab.engine import Engine
    from batchlab.schedulers import ContinuousBatcher
    from batchlab.workloads import Range, make_workload

    if answer is None or answer is ...:
        return compare(answer, 0)
    requests = make_workload(NUM_REQUESTS_3, "mixed_output", output_len=Range(4, 48),
                             arrival="poisson", rate=RATE_3, seed=SEED_3)
    for max_num_seqs in MAX_NUM_SEQS_CHOICES_3:
        trace = Engine(ContinuousBatcher(max_num_seqs=max_num_seqs),
                       SimBackend(CostModel(**COST_3), kv_capacity_tokens=1 << 20)).run(requests)
        if summarize(trace).loc["ttft", "p99"] <= TTFT_P99_TARGET_3:
            return compare(answer, max_num_seqs, what="max_num_seqs")
    return Verdict("wrong",
                   "no max_num_seqs in 1..16 meets the target (the checker's setup is broken)")
