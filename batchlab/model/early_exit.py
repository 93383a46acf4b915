"""A self-draft: the model's own first layers, then its final norm and LM head (an early exit).

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from batchlab.model.kv_cache import KVCache
from batchlab.model.llama import LlamaWeights, forward_step
from batchlab.model.paged_kv_cache import PagedKVCache


@torch.inference_mode()
def draft_early_exit(weights: LlamaWeights, cache: KVCache | PagedKVCache, exit_layer: int,
                     seqs: Sequence[tuple[str, int, int, int]]) -> list[list[int]]:
    """Each sequence's draft: ``seqs`` holds ``(request_id, newest token, its position, k)``; the
    cache must have room up to position ``position + k - 1`` (the last pass's token). Returns the
    ``k`` drafted tokens of each, in order."""
    drafts: list[list[int]] = [[] for _ in seqs]
    fed = [token for _, token, _, _ in seqs]
    for j in range(max((k for *_, k in seqs), default=0)):
        live = [i for i, (_, _, _, k) in enumerate(seqs) if k > j]
        chunks = [cache.seq_chunk(seqs[i][0], seqs[i][2] + j, [fed[i]], True) for i in live]
        choices = forward_step(weights, cache, chunks, exit_layer).argmax(dim=-1).tolist()   # (S,)
        for i, token in zip(live, choices):
            drafts[i].append(token)
            fed[i] = token
    return drafts
