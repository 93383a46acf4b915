"""Requests by kind of task, for speculative decoding: how much of the answer is in the prompt.

The rules and their reasons: ``docs/workloads-and-metrics.md``.
"""

from __future__ import annotations

import inspect

from batchlab.checks import check_choice, check_int
from batchlab.kv_blocks import blocks_for, chain_hash, steps_before_blocks_run_out
from batchlab.model.loading import chat_prompt_ids
from batchlab.plan import chunk_attention_pairs, chunk_counts, step_features
from batchlab.requests import Request
from batchlab.schedulers.continuous import ready_tokens
from batchlab.speculative.ngram import propose_ngram
from batchlab.workloads.prompts import CORPUS_PATH

TASK_KINDS = ("code_edit", "quote", "chat")

_FUNCTIONS = (blocks_for, chain_hash, steps_before_blocks_run_out, chunk_attention_pairs,
              chunk_counts, step_features, ready_tokens, propose_ngram)
_EDITS = ("Add type hints and a docstring to this Python function. Reply with the whole function.",
          ("Rename the function's arguments to longer, clearer names. "
           "Reply with the whole function."),
          "Add a comment above each line of this Python function. Reply with the whole function.",
          ("Rewrite this Python function so it checks its arguments first. "
           "Reply with the whole function."))
_QUESTIONS = (
    "What are three tips for learning to cook?", "Explain why the sky is blue.",
    "Write a short poem about trains.", "How do I make a good cup of tea?", "What is a hash table?",
    "Why do cats purr?", "Give me a plan for a rainy Sunday.", "What makes a good team leader?",
    "Describe the water cycle to a child.", "How does a bicycle stay upright?",
    "What should I pack for a weekend hike?", "Write a thank-you note to a neighbour.",
    "Why do leaves change colour in autumn?", "How can I sleep better?",
    "What is the difference between weather and climate?",
    "Suggest a name for a bakery and explain it.",
)


def task_texts(kind: str) -> list[str]:
    """The fixed prompts (user messages) of one kind of task, in order."""
    check_choice("kind", kind, TASK_KINDS)
    if kind == "chat":
        return list(_QUESTIONS)
    if kind == "code_edit":
        return [f"{edit}\n\n```python\n{inspect.getsource(f)}```"
                for f in _FUNCTIONS for edit in _EDITS[:2]]
    paragraphs = [p for p in CORPUS_PATH.read_text().split("\n\n") if len(p.split()) >= 40]
    return [f"Here is a paragraph:\n\n{p}\n\nCopy the paragraph exactly, then say in one "
            "sentence what it is about." for p in paragraphs[:16]]


def task_requests(kind: str, n: int, tokenizer, max_new_tokens: int = 128,
                  prefix: str | None = None,
                  stop_token_ids: tuple[int, ...] | None = None) -> list[Request]:
    """``n`` requests of ``kind``, cycling through its prompts in the model's chat template, all
    arriving at 0, ending at the tokenizer's end-of-sequence token (or ``stop_token_ids``) or
    after ``max_new_tokens``. Ids: ``prefix`` (default: the kind) and a number."""
    check_int("n", n)
    check_int("max_new_tokens", max_new_tokens)
    texts = task_texts(kind)
    stops = (tokenizer.eos_token_id,) if stop_token_ids is None else tuple(stop_token_ids)
    prompts = [chat_prompt_ids(tokenizer, t) for t in texts]
    return [Request(f"{prefix or kind}-{i}", prompts[i % len(prompts)], max_new_tokens,
                    stop_token_ids=stops)
            for i in range(n)]
