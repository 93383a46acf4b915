"""Prompt lookup: draft the next tokens by finding the text's own last words earlier in it.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def propose_ngram(token_ids: Sequence[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``k`` draft tokens for the context ``token_ids`` (prompt and output so far)."""
    total = len(token_ids)
    if k < 1 or total < min_n + 1:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        # occurrences that end before the last token: windows starting at 0 .. total - n - 1
        windows = sliding_window_view(tokens[:total - 1], n)          # (total - n, n)
        hits = np.flatnonzero((windows == tokens[total - n:]).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n                                   # the earliest occurrence
            return tokens[start:start + k].tolist()
    return []
