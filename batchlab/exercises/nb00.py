"""Checkers for notebook 00 (setup and tour)."""

from __future__ import annotations

from functools import lru_cache

from batchlab.exercises import Verdict, compare, exercise

JAPAN_QUESTION = "What is the capital of Japan?"
MAX_NEW_TOKENS = 16


@lru_cache(maxsize=1)
def _expected_japan_answer() -> str:
    """The model's own greedy answer, computed here with batchlab's loop (loads the model once)."""
    from batchlab.model import load_model
    from batchlab.model.generate import greedy_generate
    from batchlab.model.llama import LlamaWeights

    lm = load_model(dtype="float32")        # as notebook 00 loads it
    weights = LlamaWeights.from_hf(lm.model)
    gen = greedy_generate(weights, lm.chat_ids(JAPAN_QUESTION), MAX_NEW_TOKENS,
                          stop_token_ids=[lm.tokenizer.eos_token_id])
    return lm.decode(gen.output_ids)


@exercise("00.1")
def check_japan(answer) -> Verdict:
    """The decoded greedy answer to JAPAN_QUESTION (16 new tokens at most, stop at end of turn)."""
    if answer is None or answer is ...:
        return compare(None, None, what="answer text")
    if not isinstance(answer, str):
        return Verdict("wrong",
                       f"expected the decoded answer as a str, got a {type(answer).__name__}; "
                                "use lm.decode(output_ids)")
    expected = _expected_japan_answer()
    if answer.strip() == expected.strip():
        return Verdict("correct", f"the model answers {expected!r}")
    return Verdict("wrong", f"the greedy answer is {len(expected)} characters starting "
                            f"{expected[:12]!r}; yours is {answer[:40]!r}. Did you use the Japan "
                            "question, greedy argmax, and stop at the end-of-turn token?")
