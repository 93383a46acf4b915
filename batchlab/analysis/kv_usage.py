"""What the KV memory held, step by step, read back from a trace.

The rules and their reasons: ``docs/workloads-and-metrics.md``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from batchlab.checks import check_instance, check_int, fail
from batchlab.trace import Trace


def kv_usage(trace: Trace, block_size: int = 16, slot_len: int | None = None) -> pd.DataFrame:
    """One row per step: ``start``, ``duration``, ``num_seqs`` in flight, ``stored_tokens``,
    ``paged_tokens`` (whole blocks of ``block_size``) and, with ``slot_len``, ``slot_tokens``."""
    check_instance("trace", trace, Trace, "a batchlab Trace")
    check_int("block_size", block_size)
    check_int("slot_len", slot_len, allow_none=True)
    last_step: dict[str, int] = {}
    for s in trace.steps:
        for c in s.chunks:
            last_step[c.request_id] = s.index
    # A preemption happens while the step starting at (or just after) its time is planned.
    preemptions = sorted(trace.preemptions, key=lambda p: p.time)
    next_preemption = 0
    stored: dict[str, int] = {}
    rows = []
    for s in sorted(trace.steps, key=lambda s: s.start):
        while next_preemption < len(preemptions) and preemptions[next_preemption].time <= s.start:
            stored.pop(preemptions[next_preemption].request_id, None)
            next_preemption += 1
        for c in s.chunks:
            stored[c.request_id] = c.start + c.num_tokens
        values = np.fromiter(stored.values(), dtype=np.int64, count=len(stored))
        row = {"step": s.index, "start": s.start, "duration": s.duration, "num_seqs": len(stored),
               "stored_tokens": int(values.sum()),
               "paged_tokens": int((-(-values // block_size) * block_size).sum())}
        if slot_len is not None:
            row["slot_tokens"] = len(stored) * slot_len
        rows.append(row)
        for c in s.chunks:
            if last_step[c.request_id] == s.index and c.samples:
                stored.pop(c.request_id, None)   # its last step: it leaves afterwards
    return pd.DataFrame(rows)


def stored_share(usage: pd.DataFrame, held: str = "paged_tokens") -> float:
    """Time-weighted share of held memory (column ``held``) that stored real tokens."""
    if held not in usage:
        fail("held", held, "a column of the usage table",
             f"one of {[c for c in usage.columns if c.endswith('_tokens')]}")
    weight = usage["duration"].to_numpy(dtype=float)
    held_time = (usage[held].to_numpy(dtype=float) * weight).sum()
    if held_time <= 0:
        raise ValueError("no memory was held in any step of this trace")
    return float((usage["stored_tokens"].to_numpy(dtype=float) * weight).sum() / held_time)
