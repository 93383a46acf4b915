"""A self-draft: the model's own first layers, then its final norm and LM head (an early exit).

Layer ``i``'s keys and values depend only on the layers below it, so the first ``L`` layers of
the cache already hold exactly what a shortened model would have computed for the known text:
the draft needs no cache of its own. Drafting ``k`` tokens for a batch of sequences takes ``k``
passes, each one token per sequence through ``L`` layers (``forward_step(..., exit_layer=L)``):
the first pass feeds each sequence's newest token, the next ones the token the pass before chose
(greedily: the draft is one token for sure, as prompt lookup's; ``model.verify`` then accepts it
with the model's own probability). The passes write those layers' keys and values at the
positions the next step checks; that step computes them again with every layer, so nothing a
draft wrote is ever read by the full model.

Whether it pays depends on training. A model trained with early-exit losses (LayerSkip, Elhoushi
et al. 2024) predicts well from its middle layers; one that was not (SmolLM2) agrees with itself
rarely until its last few layers, where a draft costs almost a full step.

Shapes: S sequences drafting in a pass, V vocabulary.
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
