"""What each request asks: real English prompts cut from the corpus that ships with batchlab.

Requests made without a tokenizer are *simulated*: they carry ``prompt_len`` only. With a
tokenizer, each prompt is real English text: a window of exactly ``prompt_len`` tokens cut from
the corpus (``corpus.txt`` beside this module, package data). Which window is chosen depends only
on the request id (see ``prompt_seed``), so a workload file that stores lengths only rebuilds the
same prompts for any tokenizer, every time.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from batchlab.checks import check_callable, check_int, fail, is_int

CORPUS_PATH = Path(__file__).resolve().parent / "corpus.txt"

# A prompt source: (length, rng) -> exactly ``length`` token ids.
PromptSource = Callable[[int, np.random.Generator], list[int]]


def prompt_seed(request_id: str) -> int:
    """The seed that picks a request's prompt text: a stable hash (CRC-32) of its id.

    Because it depends on the id alone, a trace stores lengths only and still rebuilds the
    same prompts; the same id at another length starts at the same place in the corpus.
    """
    return zlib.crc32(request_id.encode("utf-8"))


def _encode_function(tokenizer: Any) -> Callable[[str], list[int]]:
    """Turn a tokenizer into ``encode(text) -> ids``: a Hugging Face tokenizer, any object with
    an ``encode(text)`` method, or a plain callable."""
    encode = getattr(tokenizer, "encode", None)
    if encode is not None:
        if hasattr(tokenizer, "all_special_ids"):
            # A Hugging Face tokenizer: no BOS/EOS markers inside a window of running text.
            return lambda text: list(encode(text, add_special_tokens=False))
        return encode
    if callable(tokenizer):
        return tokenizer
    fail("tokenizer", tokenizer, "an object with an encode(text) method or a callable text -> "
         "list of token ids")


def _vocab_size(tokenizer: Any) -> int | None:
    """Number of valid token ids, if the tokenizer says (``len()`` counts added tokens too)."""
    if hasattr(tokenizer, "__len__"):
        return len(tokenizer)
    size = getattr(tokenizer, "vocab_size", None)
    return int(size) if size is not None else None


class CorpusPrompts:
    """A prompt source: windows of real English text from ``corpus.txt`` (package data, beside
    this module).

    ``prompts(length, rng)`` picks a word in the corpus at random (with ``rng``) and returns the
    first ``length`` tokens of the text starting there. The corpus wraps around at its end, so any
    length works; the window may end in the middle of a word, as a cut always can.
    """

    def __init__(self, tokenizer: Any, corpus_path: str | Path = CORPUS_PATH) -> None:
        self.encode = _encode_function(tokenizer)
        self.vocab_size = _vocab_size(tokenizer)
        self.text = Path(corpus_path).read_text(encoding="utf-8").strip()
        if not self.text:
            raise ValueError(f"corpus {corpus_path} is empty")
        self.word_starts = [m.start() for m in re.finditer(r"\S+", self.text)]

    def text_from(self, start: int, num_chars: int) -> str:
        """``num_chars`` characters of the corpus from ``start``, going round to the beginning."""
        ring = self.text + "\n\n"
        repeats = (start + num_chars) // len(ring) + 1
        return (ring * repeats)[start:start + num_chars]

    def __call__(self, length: int, rng: np.random.Generator) -> list[int]:
        check_int("prompt length", length, hint="a number of tokens")
        start = self.word_starts[int(rng.integers(len(self.word_starts)))]
        num_chars = 4 * length + 64  # English averages about 4 characters per token; grow if short
        while True:
            ids = [int(t) for t in self.encode(self.text_from(start, num_chars))]
            if len(ids) >= length:
                return ids[:length]
            num_chars *= 2


def _check_prompt_ids(ids: Any, length: int, vocab_size: int | None, request_id: str) -> list[int]:
    if not isinstance(ids, list) or len(ids) != length:
        got = len(ids) if isinstance(ids, list) else type(ids).__name__
        raise ValueError(f"request {request_id!r}: the prompt source returned {got} ids; "
                         f"wanted a list of exactly {length}")
    for t in ids:
        if not is_int(t) or t < 0 or (vocab_size is not None and t >= vocab_size):
            allowed = f"0..{vocab_size - 1}" if vocab_size is not None else ">= 0"
            raise ValueError(f"request {request_id!r}: token id {t!r} is outside the vocabulary "
                             f"({allowed})")
    return [int(t) for t in ids]


def _prompt_source(tokenizer: Any, prompt_source: PromptSource | None) -> PromptSource | None:
    if tokenizer is not None and prompt_source is not None:
        raise ValueError("give tokenizer= (prompts cut from the corpus) or prompt_source=, "
                         "not both")
    if tokenizer is not None:
        return CorpusPrompts(tokenizer)
    if prompt_source is not None:
        check_callable("prompt_source", prompt_source, "a callable (length, rng) -> ids")
    return prompt_source


def _make_prompt(source: PromptSource, request_id: str, length: int) -> list[int]:
    vocab_size = getattr(source, "vocab_size", None)
    ids = source(length, np.random.default_rng(prompt_seed(request_id)))
    return _check_prompt_ids(ids, length, vocab_size, request_id)
