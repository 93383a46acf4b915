"""What the simulator's fast path (``sim/fast_path.py``) asks a policy and its KV space.

A policy that can promise steady decodes (after a step that decoded these requests and ended
nobody, every next step decodes each of them once, until a request arrives or finishes) mixes in
``SteadyDecodes`` and answers ``decodes_steadily`` by its own rules; the fast path runs for such
policies only. The KV questions are answered here from the space's public state, so the KV
contract (``kv_space.py``) carries none of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from batchlab.kv_blocks import steps_before_blocks_run_out
from batchlab.kv_space import KVCacheFullError, KVSpace


class SteadyDecodes(ABC):
    """A policy whose rules can say that the next steps are plain decodes of the same requests."""

    kv: KVSpace

    @abstractmethod
    def decodes_steadily(self, request_ids: tuple[str, ...], held_slots: int,
                         batch_id: int | None) -> bool:
        """After a step that decoded ``request_ids`` (in that order) and ended nobody, is every next
        step one decode for each of them, until a request arrives or finishes?"""

    def decode_steps_with_room(self, request_ids: tuple[str, ...], wanted: int) -> int:
        """How many of ``wanted`` such steps the KV room allows (each grows every sequence)."""
        return steps_with_room(self.kv, request_ids, wanted)

    def grow_for_decode_steps(self, request_ids: tuple[str, ...], num_steps: int) -> None:
        """Take the KV room of ``num_steps`` such steps at once, as planning each would have."""
        for rid in request_ids:
            if not self.kv.grow(rid, num_steps):
                raise KVCacheFullError(f"{rid!r} could not grow by {num_steps} tokens: "
                                       "decode_steps_with_room said they fit")


def steps_with_room(kv: KVSpace, request_ids: Sequence[str], wanted: int) -> int:
    """How many of ``wanted`` decode steps (a token per sequence each) ``kv`` has room for: all of
    them in a reserving space (each sequence's whole length is held), in a paged one until its
    free blocks run out."""
    if kv.block_size is None:
        return wanted
    free, size = kv.num_free_blocks, kv.block_size
    if free >= len(request_ids) * (wanted // size + 2):   # plenty: each one's growth, and one more
        return wanted
    return min(wanted,
               steps_before_blocks_run_out([kv.num_tokens_of[r] for r in request_ids], size, free))


def reuses_unheld_blocks(kv: KVSpace, prompt_ids: Sequence[int] | None, max_tokens: int) -> bool:
    """Would a prompt's first ``max_tokens`` tokens hit cached blocks that nobody holds (free
    ones, which a run's new blocks could evict)? Never in a space without a prefix cache."""
    if kv.block_size is None or not kv.enable_prefix_caching:
        return False
    return any(kv.ref_count[b] == 0 for b in kv.prefix_hits(prompt_ids, max_tokens))
