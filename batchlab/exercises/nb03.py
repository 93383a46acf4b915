"""Checkers for notebook 03 (dynamic batching). Each computes its expected answer itself, with
arithmetic or a small event loop written here, independently of ``DynamicBatcher``."""

from __future__ import annotations

from batchlab.exercises import Verdict, compare, exercise

# 03.1: a scene with the timer, a full batch and a busy server.
ARRIVALS_1 = (0.0, 0.2, 0.25, 0.3, 0.9, 2.0, 2.05)
MAX_BATCH_1, TIMEOUT_1, BATCH_S_1 = 3, 0.4, 1.0
# 03.2: idle server, Poisson arrivals.
RATE_2, TIMEOUT_2 = 20.0, 0.2
# 03.3: two batches of 4, equal step times.
OUTPUT_LENS_3 = (5, 400, 10, 300, 20, 500, 8, 250)
BATCH_SIZE_3 = 4


def _batch_starts(arrivals, max_batch, timeout, batch_s) -> list[float]:
    """Walk the timeline batch by batch: the queue's head sets the timer; the batch leaves at the
    first moment the server is free and either the timer is over or max_batch requests wait."""
    starts: list[float] = []
    free = 0.0
    while len(starts) < len(arrivals):
        head = len(starts)
        fill_index = head + max_batch - 1
        candidates = [arrivals[head] + timeout]
        if fill_index < len(arrivals):
            candidates.append(arrivals[fill_index])
        leave = max(free, min(candidates))
        size = sum(1 for t in arrivals[head:head + max_batch] if t <= leave)
        starts += [leave] * size
        free = leave + batch_s
    return starts


@exercise("03.1")
def check_batch_starts(answer) -> Verdict:
    """Batch start time of each request of ARRIVALS_1, in arrival order."""
    expected = _batch_starts(ARRIVALS_1, MAX_BATCH_1, TIMEOUT_1, BATCH_S_1)
    return compare(answer, expected, rtol=1e-6, atol=1e-9, what="batch start times (s)")


@exercise("03.2")
def check_idle_batch_size(answer) -> Verdict:
    """The first arrival starts the timer; Poisson arrivals during it number rate * timeout on
    average; the next arrival after the batch leaves starts a fresh timer (no memory)."""
    return compare(answer, 1 + RATE_2 * TIMEOUT_2, rtol=0.1, what="mean batch size")


@exercise("03.3")
def check_sorted_slot_waste(answer) -> Verdict:
    """Sorted lengths, cut into batches of 4; with equal steps each batch lasts its longest
    member and a member holds its slot for the difference."""
    lens = sorted(OUTPUT_LENS_3)
    held = total = 0
    for i in range(0, len(lens), BATCH_SIZE_3):
        batch = lens[i:i + BATCH_SIZE_3]
        held += sum(max(batch) - n for n in batch)
        total += max(batch) * len(batch)
    return compare(answer, held / total, rtol=1e-6, what="slot waste")
