"""Greedy generation for one prompt with the batched step: the smallest possible "server".

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from batchlab.checks import check_int, fail
from batchlab.model.environment import synchronize
from batchlab.model.llama import LlamaWeights, SeqChunk, forward_step


@dataclass
class Generation:
    """What ``greedy_generate`` produced and how long each step took (seconds, measured)."""

    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)   # [prefill, decode 1, decode 2, ...]

    @property
    def prefill_seconds(self) -> float:
        return self.step_seconds[0] if self.step_seconds else 0.0

    @property
    def decode_seconds(self) -> list[float]:
        return self.step_seconds[1:]


def greedy_generate(weights: LlamaWeights, prompt_ids: list[int], max_new_tokens: int,
                    stop_token_ids: Iterable[int] = ()) -> Generation:
    """Generate up to ``max_new_tokens`` tokens greedily for one prompt, timing every step.

    A fresh one-slot KV cache holds exactly the prompt plus the new tokens. The stop token, if
    one is produced, is kept as the last output token (``LoadedModel.decode`` hides it).
    """
    prompt_ids = [int(t) for t in prompt_ids]
    if not prompt_ids:
        fail("prompt_ids", prompt_ids, "a non-empty list of token ids",
             "a prompt needs at least 1 token")
    check_int("max_new_tokens", max_new_tokens)
    stops = set(int(t) for t in stop_token_ids)
    cache = weights.new_kv_cache(num_slots=1, max_seq_len=len(prompt_ids) + max_new_tokens)
    gen = Generation(prompt_ids)
    # Prefill: the whole prompt in one chunk at positions 0 .. P-1.
    chunk = SeqChunk(slot=0, start=0, token_ids=prompt_ids, want_logits=True)
    while True:
        synchronize(weights.device)
        t0 = time.perf_counter()
        logits = forward_step(weights, cache, [chunk])      # (1, V)
        next_id = int(logits[0].argmax())
        synchronize(weights.device)
        gen.step_seconds.append(time.perf_counter() - t0)
        gen.output_ids.append(next_id)
        if len(gen.output_ids) == max_new_tokens or next_id in stops:
            return gen
        # Decode: the newest token goes to the next free position, P + (tokens so far) - 1.
        chunk = SeqChunk(0, len(prompt_ids) + len(gen.output_ids) - 1, [next_id], True)
