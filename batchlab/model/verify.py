"""Checking a draft: which of the drafted tokens the model itself would have produced.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from batchlab.model.sampling import (RequestSampler, apply_penalties, bias_and_mask, filtered_probs,
                                     token_logprobs)
from batchlab.requests import Request, TokenLogprobs


class _Continued:
    """A request as the sampler sees it after ``extra`` more output tokens (read-only)."""

    __slots__ = ("request_id", "sampling", "prompt_ids", "output_ids", "stop_token_ids")

    def __init__(self, req: Request, extra: Sequence[int]) -> None:
        self.request_id = req.request_id
        self.sampling, self.prompt_ids, self.stop_token_ids = (req.sampling, req.prompt_ids,
                                                               req.stop_token_ids)
        self.output_ids = req.output_ids + list(extra)


def accept_greedy(choices: Sequence[int], draft: Sequence[int]) -> list[int]:
    """The tokens a greedy check emits: the draft's longest prefix that matches ``choices`` (the
    model's choice at each of the ``k + 1`` positions), then the choice after it."""
    accepted = 0
    while accepted < len(draft) and draft[accepted] == choices[accepted]:
        accepted += 1
    return list(draft[:accepted]) + [choices[accepted]]


def verify_draft(logits: torch.Tensor, req: Request, draft: Sequence[int],
                 sampler: RequestSampler) -> tuple[list[int], list[TokenLogprobs] | None]:
    """The tokens one request's check emits (1 to ``k + 1``), and their log-probabilities when
    ``req.sampling.logprobs`` asks. ``logits``: (k + 1, V), the rows after each verified
    position."""
    p = req.sampling
    if p.plain_greedy:
        tokens = accept_greedy(logits.float().argmax(dim=-1).tolist(), draft)
    else:
        tokens = []
        for i in range(len(draft) + 1):
            token, accepted = _check_position(logits[i], _Continued(req, tokens),
                                              draft[i] if i < len(draft) else None, sampler)
            tokens.append(token)
            if not accepted:
                break
    if p.logprobs is None:
        return tokens, None
    return tokens, [token_logprobs(logits[i], t, p.logprobs) for i, t in enumerate(tokens)]


def _check_position(raw: torch.Tensor, view: _Continued, drafted: int | None,
                    sampler: RequestSampler) -> tuple[int, bool]:
    """One position: the token it emits, and whether that was the drafted one (so checking goes on).
    ``drafted`` None: the position after the last draft, which emits the bonus token."""
    p = view.sampling
    logits = bias_and_mask(raw.float().cpu().clone(), view)
    if p.penalized:
        logits = apply_penalties(logits, view)
    if p.greedy:
        token = int(logits.argmax())
        return token, token == drafted
    probs = filtered_probs(logits, p)
    gen = sampler.generator(view.request_id, p)
    if drafted is not None:
        if float(torch.rand(1, generator=gen)) < float(probs[drafted]):
            return drafted, True
        probs = probs.clone()
        probs[drafted] = 0.0                     # max(0, p - q) for a one-token q, renormalized
        probs /= probs.sum()
    return int(torch.multinomial(probs, 1, generator=gen)), False
