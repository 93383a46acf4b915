"""Choosing the next token from logits: greedy, or temperature + top-p with a per-request seed.

Each sampled request draws from its own ``torch.Generator`` seeded from its ``SamplingParams``,
so the tokens it gets do not depend on which other requests happened to share its steps (a
shared generator would hand out random numbers in batch order, and batching would change the
text).
"""

from __future__ import annotations

import torch

from batchlab.requests import SamplingParams


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probabilities add up to ``top_p``;
    zero the rest and renormalize. ``probs``: (V,)."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(descending=True)
    # A token is kept if the mass before it is still below top_p (so the first is always kept).
    keep_sorted = (sorted_probs.cumsum(0) - sorted_probs) < top_p
    kept = torch.zeros_like(probs)
    kept[order[keep_sorted]] = sorted_probs[keep_sorted]
    return kept / kept.sum()


class RequestSampler:
    """Samples next tokens for many requests, each with its own generator."""

    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        gen = self._generators.get(request_id)
        if gen is None:
            gen = torch.Generator()  # on the CPU: the same seed gives the same draws on any device
            gen.manual_seed(params.seed if params.seed is not None else torch.seed())
            self._generators[request_id] = gen
        return gen

    def sample(self, logits: torch.Tensor, request_ids: list[str],
               params: list[SamplingParams]) -> list[int]:
        """One token per row of ``logits`` (S, V)."""
        if logits.shape[0] != len(request_ids) or len(request_ids) != len(params):
            raise ValueError(f"{logits.shape[0]} logit rows for {len(request_ids)} requests and "
                             f"{len(params)} sampling settings; they must match")
        # argmax in fp32: exact for bf16/fp16 logits, and torch's CPU argmax over 16 rows of 49,152
        # bf16 logits took 1.5 ms against 0.7 ms with the conversion (2026-12-02, torch 2.13)
        greedy = logits.float().argmax(dim=-1).tolist()
        tokens = []
        for row, (rid, p) in enumerate(zip(request_ids, params)):
            if p.greedy:
                tokens.append(greedy[row])
                continue
            probs = torch.softmax(logits[row].float().cpu() / p.temperature, dim=-1)
            probs = top_p_filter(probs, p.top_p)
            tokens.append(int(torch.multinomial(probs, 1, generator=self._generator(rid, p))))
        return tokens

    def forget(self, request_id: str) -> None:
        """Drop a finished request's generator."""
        self._generators.pop(request_id, None)
