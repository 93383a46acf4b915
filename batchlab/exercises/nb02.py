"""Checkers for notebook 02 (static batching). Each computes its expected answer by arithmetic,
independently of the scheduler code the notebook uses to find it."""

from __future__ import annotations

from batchlab.exercises import Verdict, compare, exercise

# 02.1: one full static batch, arrivals evenly spaced.
BATCH_SIZE_1, GAP_S_1 = 8, 0.5
# 02.2: one batch of requests arriving together, every step the same length.
OUTPUT_LENS_2 = (4, 4, 4, 4, 4, 48)
# 02.3: step cost fixed + per_seq * b; an offline job served alone or in batches.
FIXED_S_3, PER_SEQ_S_3 = 0.040, 0.005
NUM_REQUESTS_3, OUTPUT_TOKENS_3, BATCH_SIZE_3 = 64, 32, 16


@exercise("02.1")
def check_mean_fill_wait(answer) -> Verdict:
    """Mean wait for the batch to fill: request i (0-based) waits (B - 1 - i) gaps."""
    waits = [(BATCH_SIZE_1 - 1 - i) * GAP_S_1 for i in range(BATCH_SIZE_1)]
    return compare(answer, sum(waits) / len(waits), rtol=1e-6, what="mean wait (s)")


@exercise("02.2")
def check_slot_waste(answer) -> Verdict:
    """A batch lasts max(L) steps; request i holds its slot for max(L) - L_i of them."""
    steps = max(OUTPUT_LENS_2)
    held = sum(steps - n for n in OUTPUT_LENS_2)
    return compare(answer, held / (steps * len(OUTPUT_LENS_2)), rtol=1e-6, what="slot waste")


@exercise("02.3")
def check_offline_speedup(answer) -> Verdict:
    """Every request needs OUTPUT_TOKENS_3 steps (its first token comes from the prompt step);
    full batches of equal requests make B tokens per step of cost fixed + per_seq * B."""
    alone_s = NUM_REQUESTS_3 * OUTPUT_TOKENS_3 * (FIXED_S_3 + PER_SEQ_S_3 * 1)
    num_batches = NUM_REQUESTS_3 // BATCH_SIZE_3
    batched_s = num_batches * OUTPUT_TOKENS_3 * (FIXED_S_3 + PER_SEQ_S_3 * BATCH_SIZE_3)
    # Same tokens in both runs, so the throughput ratio is the ratio of durations.
    return compare(answer, alone_s / batched_s, rtol=1e-3, what="throughput ratio")
