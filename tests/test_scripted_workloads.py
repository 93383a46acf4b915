"""scripted_workload: requests at exactly the given times and lengths, prompts as make_workload's."""

import pytest

from batchlab.workloads import make_workload
from batchlab.workloads.scripted import scripted_workload


def word_ids(text: str) -> list[int]:
    """A crude real tokenizer: one id per word (its length), enough to cut corpus windows."""
    return [len(w) for w in text.split()]


def test_times_and_lengths_are_exactly_as_given():
    reqs = scripted_workload([0.0, 0.0, 1.5], max_new_tokens=[4, 4, 48], prompt_len=[8, 9, 10])
    assert [r.request_id for r in reqs] == ["r000", "r001", "r002"]
    assert [r.arrival_time for r in reqs] == [0.0, 0.0, 1.5]
    assert [r.max_new_tokens for r in reqs] == [4, 4, 48]
    assert [r.prompt_len for r in reqs] == [8, 9, 10]
    assert all(r.prompt_ids is None for r in reqs)           # simulated without a tokenizer


def test_one_int_applies_to_every_request():
    reqs = scripted_workload(range(4), max_new_tokens=8, prompt_len=16, id_prefix="q")
    assert [r.request_id for r in reqs] == ["q000", "q001", "q002", "q003"]
    assert {(r.max_new_tokens, r.prompt_len) for r in reqs} == {(8, 16)}


def test_prompts_are_the_same_corpus_windows_as_make_workload():
    scripted = scripted_workload([0.0, 0.0], max_new_tokens=3, prompt_len=12, tokenizer=word_ids)
    drawn = make_workload(2, prompt_len=12, output_len=3, arrival="at_once", tokenizer=word_ids)
    assert [r.prompt_ids for r in scripted] == [r.prompt_ids for r in drawn]
    assert all(len(r.prompt_ids) == 12 for r in scripted)


@pytest.mark.parametrize("kwargs, message", [
    (dict(arrival_times=[], max_new_tokens=1), "empty"),
    (dict(arrival_times=[1.0, 0.5], max_new_tokens=1), "earlier than"),
    (dict(arrival_times=[-1.0], max_new_tokens=1), ">= 0"),
    (dict(arrival_times=[float("nan")], max_new_tokens=1), ">= 0"),
    (dict(arrival_times=[0.0, 1.0], max_new_tokens=[4]), "one per request"),
    (dict(arrival_times=[0.0], max_new_tokens=0), "int >= 1"),
    (dict(arrival_times=[0.0], max_new_tokens=1, prompt_len=2.5), "int >= 1"),
    (dict(arrival_times=[0.0], max_new_tokens=1, id_prefix=3), "id_prefix"),
])
def test_bad_inputs_are_refused_with_the_reason(kwargs, message):
    with pytest.raises(ValueError, match=message):
        scripted_workload(**kwargs)
