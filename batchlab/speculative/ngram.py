"""Prompt lookup: draft the next tokens by finding the text's own last words earlier in it.

Copy-heavy requests (an edit of a given code file, a summary that quotes) repeat runs of their
context. If the last ``n`` tokens occurred before, the tokens that followed them then are a good
guess for what follows now. The rule, as vLLM's ``ngram`` proposer
(``vllm/v1/spec_decode/ngram_proposer.py``): take the longest ``n`` in
``[prompt_lookup_min, prompt_lookup_max]`` whose last-``n``-token suffix occurs earlier in the
context (an occurrence may overlap the suffix, not be it), the earliest such occurrence, and
propose up to ``k`` tokens that followed it (fewer when the context ends first). No match, no
draft. It costs a search over the context, no model call.
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
