"""The server's incremental detokenizer: the same text as decoding the whole output, stop strings
never leaked in part, and work per token that does not grow with the output."""

from __future__ import annotations

import random

import pytest

from batchlab.serve.detok import Detokenizer

TEXTS = ["Héllo wörld, 你好 — emoji 🎉 done.", "def add(a, b):\n    return a + b\n", "Ünïcödé ß ø å ∑ ∫ ≈ ✓ 日本語のテキスト",
         "The quick brown fox jumps over the lazy dog. " * 4]


def stream(detok: Detokenizer, ids: list[int]) -> str:
    return "".join(detok.add(t) for t in ids) + detok.flush()


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_text_equals_decoding_the_whole_output(lm, text):
    tok = lm.tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert stream(Detokenizer(tok), ids) == tok.decode(ids, skip_special_tokens=True)


def test_random_token_sequences_and_special_tokens(lm):
    tok = lm.tokenizer
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randint(1, 40))]
        assert stream(Detokenizer(tok), ids) == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("stop", [["fox jumps"], ["lazy", "quick"], ["z"], ["o"], ["dog. The"]])
def test_stop_strings_cut_before_the_match_and_never_leak(lm, stop):
    tok = lm.tokenizer
    text = TEXTS[-1]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    detok = Detokenizer(tok, stop)
    sent = ""
    for t in ids:
        sent += detok.add(t)
        assert not any(s in sent for s in stop)
        assert len(detok.pending) <= detok.hold + 32     # held back: never more than a token past the hold
    sent += detok.flush()
    first = min(text.index(s) for s in stop)
    assert detok.stopped and sent == text[:first]
    kept = stream(Detokenizer(tok, stop, include_stop=True), ids)
    match = min(stop, key=text.index)
    assert kept == text[:first + len(match)]


def test_no_stop_string_in_the_text_holds_nothing_back_at_the_end(lm):
    tok = lm.tokenizer
    ids = tok("a short answer", add_special_tokens=False)["input_ids"]
    detok = Detokenizer(tok, ["never there"])
    assert stream(detok, ids) == "a short answer" and not detok.stopped and detok.num_tokens == len(ids)
