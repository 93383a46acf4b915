"""Served alone or in a batch: identical greedy answers in fp32; in bf16, only close logits."""

import pytest

from batchlab.model import load_model
from batchlab.model.divergence import DIVERGENCE_COLUMNS, compare_alone_and_together, greedy_batch_logits, \
    parted_between, parted_from_alone
from batchlab.model.llama import LlamaWeights

PROMPTS = ["The capital of France is", "Two plus two equals", "My favourite colour is"]


def short_prompts(lm):
    return [lm.tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def bf16_weights():
    return LlamaWeights.from_hf(load_model(device="cpu", dtype="bfloat16").model)


def test_fp32_answers_are_identical_and_logits_nearly_so(lm):
    weights = LlamaWeights.from_hf(load_model(device="cpu", dtype="float32").model)
    table = compare_alone_and_together(weights, short_prompts(lm), max_new_tokens=8)
    assert list(table.columns) == DIVERGENCE_COLUMNS
    assert table.identical.all(), table
    assert table.first_divergence.isna().all() and table.tie_margin.isna().all()
    assert (table.max_logit_diff < 1e-3).all(), table      # measured about 1e-4 on the course CPU


def test_bf16_logits_stay_close_and_any_divergence_is_at_a_near_tie(lm, bf16_weights):
    table = compare_alone_and_together(bf16_weights, short_prompts(lm)[:2], max_new_tokens=6)
    # bf16 keeps 8 mantissa bits: a logit near 20 moves in steps of 0.125. Measured: up to 0.94
    # (8 chat prompts, 48 tokens) on the course CPU; divergences at margins 0 and 0.125.
    assert (table.max_logit_diff < 2.0).all(), table
    diverged = table[~table.identical]
    assert (diverged.tie_margin <= 0.25).all(), table


def test_a_batch_of_one_is_the_lone_run(lm, bf16_weights):
    prompt = short_prompts(lm)[0]
    tokens, logits = greedy_batch_logits(bf16_weights, [prompt], max_new_tokens=3)
    assert len(tokens) == 1 and len(tokens[0]) == 3 and logits.shape[:2] == (1, 3)
    assert logits[0].argmax(dim=-1).tolist() == tokens[0]


@pytest.mark.parametrize("prompts, n, message", [
    ([], 4, r"prompts=\[\]; must be a non-empty list"),
    ([[1, 2], []], 4, r"prompts=\[\[1, 2\], \[\]\]; must be a non-empty list"), ([[1, 2]], 0, "max_new_tokens=0"),
    ([[1, 2]], True, "max_new_tokens=True")])
def test_bad_input_is_named(bf16_weights, prompts, n, message):
    with pytest.raises(ValueError, match=message):
        greedy_batch_logits(bf16_weights, prompts, n)


def test_parted_from_alone_finds_where_and_how_close_an_answer_parted(lm, bf16_weights):
    prompts = dict(enumerate(short_prompts(lm)[:2]))
    alone, logits = greedy_batch_logits(bf16_weights, [prompts[0]], max_new_tokens=5)
    assert parted_from_alone(bf16_weights, prompts, {0: alone[0]}) == {}
    runner_up = int(logits[0, 2].topk(2).indices[1])          # the lone run's second choice at token 2
    changed = alone[0][:2] + [runner_up, 7, 7]
    [(key, (k, margin))] = parted_from_alone(bf16_weights, prompts, {0: changed}).items()
    assert (key, k) == (0, 2)
    assert margin == pytest.approx(float(logits[0, 2].max() - logits[0, 2, runner_up])) and margin >= 0
    # Between runs: only the request whose answers differ is measured, with the worse margin.
    other, _ = greedy_batch_logits(bf16_weights, [prompts[1]], max_new_tokens=5)
    runs = {"a": {0: alone[0], 1: other[0]}, "b": {0: changed, 1: other[0]}}
    assert parted_between(bf16_weights, prompts, runs) == {0: (2, margin)}
