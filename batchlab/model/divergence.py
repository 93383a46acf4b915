"""Does batching change my answer? Greedy answers served alone and together, compared token by
token.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import pandas as pd
import torch

from batchlab.checks import check_int, fail
from batchlab.model.llama import LlamaWeights, SeqChunk, forward_step

# Logits: the widest gap between the lone run's two best tokens at which a bf16 answer was seen to
# part from its lone run (measured margins: notebook 04, and data/divergence/).
NEAR_TIE = 0.5

DIVERGENCE_COLUMNS = ["prompt", "prompt_len", "identical", "first_divergence", "tie_margin",
                      "max_logit_diff"]


def greedy_batch_logits(weights: LlamaWeights, prompts: Sequence[Sequence[int]],
                        max_new_tokens: int) -> tuple[list[list[int]], torch.Tensor]:
    """Serve ``prompts`` together as one batch, greedily, for exactly ``max_new_tokens`` tokens.

    Returns each prompt's tokens and the logits that chose them, float32 on the CPU, shaped
    (num_prompts, max_new_tokens, V). A batch of one prompt is "served alone".
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        fail("prompts", prompts, "a non-empty list of non-empty token-id lists")
    check_int("max_new_tokens", max_new_tokens)
    cache = weights.new_kv_cache(len(prompts), max_seq_len=max(map(len, prompts)) + max_new_tokens)
    # Step 0: every prompt's prefill in one step (slot i, positions 0 .. P_i - 1).
    chunks = [SeqChunk(i, 0, [int(t) for t in p], want_logits=True) for i, p in enumerate(prompts)]
    tokens, logits = [[] for _ in prompts], []
    for _ in range(max_new_tokens):
        step_logits = forward_step(weights, cache, chunks)          # (S, V), one row per prompt
        logits.append(step_logits.float().cpu())
        for i, token in enumerate(step_logits.argmax(dim=-1).tolist()):
            tokens[i].append(token)
        # Decode: each prompt's newest token at its next position, P_i + (tokens so far) - 1.
        chunks = [SeqChunk(i, len(p) + len(tokens[i]) - 1, [tokens[i][-1]], True)
                  for i, p in enumerate(prompts)]
    return tokens, torch.stack(logits, dim=1)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token where two answers differ (None if one is a prefix of the other)."""
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)


def tie_margin(logits: torch.Tensor, chosen: int, other: int) -> float:
    """How many logits ``chosen`` beat ``other`` by in one row of logits (V,): near 0, a
    near-tie."""
    return float(logits[chosen] - logits[other])


def parted_from_alone(weights: LlamaWeights, prompts: Mapping[Hashable, Sequence[int]],
                      answers: Mapping[Hashable, Sequence[int]]
                      ) -> dict[Hashable, tuple[int, float]]:
    """Serve each answered prompt alone (greedy, as many tokens as its answer) and compare.

    ``prompts`` and ``answers`` are keyed alike (a request's id, say). Returns, for every answer
    that parts from its lone run, ``(k, margin)``: the index of its first different token and how
    many logits the lone run's choice beat the answer's token by there (``tie_margin``, in the
    lone run's own logits). Identical answers are left out, so ``{}`` means all were identical.
    """
    parted = {}
    for key, answer in answers.items():
        if not answer:
            continue
        [alone], logits = greedy_batch_logits(weights, [prompts[key]], len(answer))
        k = first_divergence(answer, alone)
        if k is not None:
            parted[key] = (k, tie_margin(logits[0, k], alone[k], answer[k]))
    return parted


def parted_between(weights: LlamaWeights, prompts: Mapping[Hashable, Sequence[int]],
                   runs: Mapping[str, Mapping[Hashable, Sequence[int]]]
                   ) -> dict[Hashable, tuple[int, float]]:
    """The answers that differ between ``runs`` (run name -> key -> answer), each with where the
    runs parted from its lone run: ``(first different token of any run, the largest margin)``.

    When two runs of the same requests disagree, at least one of them parted from the request
    served alone, so every key returned has an entry measured by ``parted_from_alone``.
    """
    first, *others = runs.values()
    differ = [key for key in first if any(run[key] != first[key] for run in others)]
    parted: dict[Hashable, tuple[int, float]] = {}
    for run in runs.values():
        for key, (k, margin) in parted_from_alone(weights, prompts,
                                                  {d: run[d] for d in differ}).items():
            k0, m0 = parted.get(key, (k, margin))
            parted[key] = (min(k, k0), max(margin, m0))
    return parted


def compare_alone_and_together(weights: LlamaWeights, prompts: Sequence[Sequence[int]],
                               max_new_tokens: int) -> pd.DataFrame:
    """One row per prompt: did serving it in a batch with the others change its greedy answer?

    Columns: ``identical``; ``first_divergence`` (index of the first output token that differs,
    None when identical); ``tie_margin`` (at that token, how many logits the lone run's choice
    beat the batched run's choice by, in the lone run's own logits: a small number means the two
    tokens were nearly tied); ``max_logit_diff`` (the largest |alone - together| logit over the
    steps both runs computed from the same prefix: up to and including the divergence).
    """
    together, together_logits = greedy_batch_logits(weights, prompts, max_new_tokens)
    rows = []
    for i, prompt in enumerate(prompts):
        alone, alone_logits = greedy_batch_logits(weights, [prompt], max_new_tokens)
        alone, alone_logits = alone[0], alone_logits[0]                 # (n,), (n, V)
        first = first_divergence(alone, together[i])
        same_prefix = max_new_tokens if first is None else first + 1    # logits up to the choice
        diff = (alone_logits[:same_prefix] - together_logits[i, :same_prefix]).abs().max().item()
        margin = None if first is None else tie_margin(alone_logits[first], alone[first],
                                                        together[i][first])
        rows.append({"prompt": i, "prompt_len": len(prompt), "identical": first is None,
                     "first_divergence": first, "tie_margin": margin, "max_logit_diff": diff})
    return divergence_table(rows)


def divergence_table(rows: Sequence[dict]) -> pd.DataFrame:
    """The comparison's rows (as made above, or read back from a JSON file) as a typed table:
    ``first_divergence`` an integer column with <NA> where identical, ``tie_margin`` NaN there."""
    table = pd.DataFrame(list(rows), columns=DIVERGENCE_COLUMNS)
    return table.astype({"first_divergence": "Int64", "tie_margin": float, "max_logit_diff": float,
                         "identical": bool})
