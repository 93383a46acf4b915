"""Tests for batchlab.workloads: arrivals, length presets, prompts from the corpus, JSONL traces."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from batchlab.requests import Request, SamplingParams
from batchlab.workloads import (
    ARRIVALS, CORPUS_PATH, PRESETS, CorpusPrompts, Fixed, LengthPreset, Mixture, Range,
    arrivals_at_once, arrivals_fixed, arrivals_gamma, arrivals_poisson, get_preset, load_workload,
    make_arrivals, make_workload, prompt_seed, read_workload_header, request_ids, save_workload,
    scale_arrivals,
)

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data"
CORPUS = CORPUS_PATH.read_text(encoding="utf-8")


class WhitespaceTokenizer:
    """A real, if crude, tokenizer: one id per whitespace-separated word of the corpus.

    Id 0 stands for a word it has never seen (a window can end inside a word).
    """

    def __init__(self, text: str) -> None:
        self.words = ["<unk>"] + sorted(set(text.split()))
        self.ids = {w: i for i, w in enumerate(self.words)}
        self.vocab_size = len(self.words)

    def encode(self, text: str) -> list[int]:
        return [self.ids.get(w, 0) for w in text.split()]

    def decode(self, ids: list[int]) -> list[str]:
        return [self.words[i] for i in ids]


WS = WhitespaceTokenizer(CORPUS)


def is_run_of_corpus_words(words: list[str]) -> bool:
    """True if ``words`` appear one after another in the corpus (which wraps around)."""
    corpus_words = CORPUS.split()
    ring = corpus_words + corpus_words
    return any(ring[i:i + len(words)] == words for i in range(len(corpus_words)))


def gap_cv(times: np.ndarray) -> float:
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


# ---------------------------------------------------------------------------------------------
# Arrival processes
# ---------------------------------------------------------------------------------------------

def test_at_once_and_fixed_interval():
    assert np.array_equal(arrivals_at_once(5), np.zeros(5))
    times = arrivals_fixed(5, rate=4.0)
    assert np.allclose(times, [0.0, 0.25, 0.5, 0.75, 1.0])


def test_poisson_mean_gap_and_cv():
    times = arrivals_poisson(20_000, rate=5.0, seed=0)
    assert times[0] == 0.0 and np.all(np.diff(times) >= 0)
    assert np.diff(times).mean() == pytest.approx(1 / 5.0, rel=0.03)
    assert gap_cv(times) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 1.0, 4.0])
def test_gamma_cv_is_one_over_sqrt_burstiness(burstiness):
    times = arrivals_gamma(20_000, rate=2.0, burstiness=burstiness, seed=1)
    assert np.all(np.diff(times) >= 0)
    assert np.diff(times).mean() == pytest.approx(0.5, rel=0.05)
    assert gap_cv(times) == pytest.approx(1 / math.sqrt(burstiness), rel=0.08)


def test_burstiness_one_is_poisson_and_rate_only_scales_time():
    assert np.array_equal(arrivals_gamma(50, 3.0, 1.0, seed=7), arrivals_poisson(50, 3.0, seed=7))
    slow = arrivals_gamma(50, 1.0, 0.5, seed=7)
    fast = arrivals_gamma(50, 4.0, 0.5, seed=7)
    assert np.allclose(fast, slow / 4)


def test_arrivals_are_reproducible_and_seed_dependent():
    assert np.array_equal(arrivals_poisson(100, 2.0, seed=3), arrivals_poisson(100, 2.0, seed=3))
    assert not np.array_equal(arrivals_poisson(100, 2.0, seed=3), arrivals_poisson(100, 2.0, seed=4))
    rng = np.random.default_rng(0)
    first, second = arrivals_poisson(10, 2.0, rng), arrivals_poisson(10, 2.0, rng)
    assert not np.array_equal(first, second)  # a Generator is drawn from, so it advances


def test_infinite_rate_means_all_at_once():
    assert np.array_equal(arrivals_poisson(4, math.inf), np.zeros(4))


def test_make_arrivals_dispatches_by_name():
    assert np.array_equal(make_arrivals(3, "at_once"), np.zeros(3))
    assert np.allclose(make_arrivals(3, "fixed", rate=2.0), [0, 0.5, 1.0])
    assert np.array_equal(make_arrivals(9, "poisson", rate=2.0, seed=5), arrivals_poisson(9, 2.0, 5))
    assert np.array_equal(make_arrivals(9, "gamma", rate=2.0, burstiness=0.3, seed=5),
                          arrivals_gamma(9, 2.0, 0.3, 5))
    assert set(ARRIVALS) == {"at_once", "fixed", "poisson", "gamma"}


@pytest.mark.parametrize("call, message", [
    (lambda: arrivals_poisson(10, 0.0), "rate=0.0"),
    (lambda: arrivals_poisson(10, -2), "rate=-2"),
    (lambda: arrivals_poisson(10, float("nan")), "rate=nan"),
    (lambda: arrivals_fixed(10, None), "rate=None; must be a number > 0 or math.inf"),
    (lambda: make_arrivals(10, "poisson"), "needed by arrival='poisson'"),
    (lambda: arrivals_gamma(10, 1.0, 0.0), "burstiness=0.0"),
    (lambda: arrivals_gamma(10, 1.0, -1), "burstiness=-1"),
    (lambda: arrivals_gamma(10, 1.0, math.inf), "burstiness=inf"),
    (lambda: arrivals_poisson(0, 1.0), "n=0"),
    (lambda: arrivals_at_once(-3), "n=-3"),
    (lambda: arrivals_fixed(2.5, 1.0), "n=2.5"),
    (lambda: arrivals_poisson(5, 1.0, seed=-1), "seed=-1"),
    (lambda: arrivals_poisson(5, 1.0, seed=None), "seed=None"),
    (lambda: make_arrivals(5, "uniform", rate=1.0),
     "arrival='uniform'; must be one of ['at_once', 'fixed', 'poisson', 'gamma']"),
    (lambda: make_arrivals(5, "poisson", rate=1.0, burstiness=0.5),
     "burstiness=0.5; must be 1.0 unless arrival='gamma'"),
    (lambda: make_arrivals(5, "at_once", rate=1.0), "rate=1.0; must be None for arrival='at_once'"),
])
def test_arrival_errors_name_the_value(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


# ---------------------------------------------------------------------------------------------
# Length distributions and presets
# ---------------------------------------------------------------------------------------------

def test_length_distributions():
    rng = np.random.default_rng(0)
    assert set(Fixed(7).sample(20, rng)) == {7}
    drawn = Range(3, 6).sample(2000, rng)
    assert set(drawn) == {3, 4, 5, 6}  # both ends included
    assert Range(3, 6).mean == 4.5
    mix = Mixture(((3, Fixed(1)), (1, Fixed(100))))
    drawn = mix.sample(8000, rng)
    assert set(drawn) == {1, 100}
    assert np.mean(drawn == 1) == pytest.approx(0.75, abs=0.02)
    assert mix.mean == pytest.approx(0.75 * 1 + 0.25 * 100)


@pytest.mark.parametrize("make, message", [
    (lambda: Fixed(0), "Fixed.tokens=0"),
    (lambda: Fixed(2.5), "Fixed.tokens=2.5"),
    (lambda: Range(0, 4), "Range.low=0"),
    (lambda: Range(5, 3), "Range.high=3; must be >= Range.low=5"),
    (lambda: Mixture(()), r"Mixture.parts=\(\); must be at least one"),
    (lambda: Mixture(((-1, Fixed(3)),)), r"Mixture.parts\[0\] weight=-1; must be a finite number > 0"),
    (lambda: Mixture(((1, 5),)), r"Mixture.parts\[0\] distribution=5; must be a Fixed, Range or Mixture"),
    (lambda: LengthPreset("x", "gpu", Fixed(1), Fixed(1)), "scale='gpu'"),
])
def test_length_distribution_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_named_presets_have_the_articles_lengths():
    assert (get_preset("prefill_heavy", "full").prompt_len, get_preset("prefill_heavy", "full").output_len) \
        == (Fixed(2000), Fixed(20))
    assert (get_preset("decode_heavy", "full").prompt_len, get_preset("decode_heavy", "full").output_len) \
        == (Fixed(20), Fixed(2000))
    assert (get_preset("prefill_heavy").prompt_len, get_preset("prefill_heavy").output_len) \
        == (Fixed(400), Fixed(8))
    assert (get_preset("decode_heavy").prompt_len, get_preset("decode_heavy").output_len) \
        == (Fixed(8), Fixed(160))
    assert get_preset("mixed_output", "full").output_len == Range(5, 500)
    same = get_preset("same_length", "cpu")
    assert isinstance(same.output_len, Fixed) and isinstance(same.prompt_len, Fixed)


def test_every_preset_exists_at_both_scales_and_cpu_is_smaller():
    assert set(PRESETS["cpu"]) == set(PRESETS["full"]) == {
        "chat", "prefill_heavy", "decode_heavy", "mixed_output", "same_length"}
    for name in PRESETS["cpu"]:
        cpu, full = get_preset(name, "cpu"), get_preset(name, "full")
        assert (cpu.name, cpu.scale, full.scale) == (name, "cpu", "full")
        assert cpu.prompt_len.mean + cpu.output_len.mean < full.prompt_len.mean + full.output_len.mean
        assert cpu.output_len.mean >= 8 or name == "prefill_heavy"  # enough tokens to show decode


def test_chat_preset_draws_short_and_medium_lengths():
    reqs = make_workload(2000, "chat", scale="full", arrival="at_once", seed=0)
    prompts = np.array([r.prompt_len for r in reqs])
    outputs = np.array([r.max_new_tokens for r in reqs])
    assert prompts.min() >= 16 and prompts.max() <= 1024
    assert np.mean(prompts <= 256) == pytest.approx(0.7, abs=0.04)
    assert outputs.min() >= 16 and outputs.max() <= 512


@pytest.mark.parametrize("call, message", [
    (lambda: get_preset("chatty"), r"preset='chatty'; must be one of \['chat', 'prefill_heavy'"),
    (lambda: get_preset("chat", "gpu"), r"scale='gpu'; must be one of \['cpu', 'full'\]"),
])
def test_preset_errors_list_allowed_names(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ---------------------------------------------------------------------------------------------
# make_workload
# ---------------------------------------------------------------------------------------------

def test_simulated_workload_shape():
    reqs = make_workload(12, "decode_heavy", arrival="poisson", rate=3.0, seed=0)
    assert [r.request_id for r in reqs] == [f"r{i:03d}" for i in range(12)]
    assert all(isinstance(r, Request) and r.prompt_ids is None for r in reqs)
    assert {(r.prompt_len, r.max_new_tokens) for r in reqs} == {(8, 160)}
    times = [r.arrival_time for r in reqs]
    assert times == sorted(times) and times[0] == 0.0
    assert all(r.sampling == SamplingParams() for r in reqs)


def test_request_ids_widen_for_large_workloads():
    assert request_ids(3, "q") == ["q000", "q001", "q002"]
    ids = request_ids(1001)
    assert ids[0] == "r0000" and ids[-1] == "r1000" and ids == sorted(ids)


def test_workload_is_reproducible_by_seed():
    def summary(reqs):
        return [(r.request_id, r.arrival_time, r.prompt_len, r.max_new_tokens) for r in reqs]
    a = make_workload(20, "chat", rate=2.0, seed=11)
    assert summary(a) == summary(make_workload(20, "chat", rate=2.0, seed=11))
    assert summary(a) != summary(make_workload(20, "chat", rate=2.0, seed=12))
    rng = np.random.default_rng(5)  # a Generator works too, and each call draws afresh
    b, c = make_workload(20, "chat", rate=2.0, seed=rng), make_workload(20, "chat", rate=2.0, seed=rng)
    assert summary(b) != summary(c)
    assert summary(b) == summary(make_workload(20, "chat", rate=2.0, seed=np.random.default_rng(5)))


def test_changing_rate_or_process_moves_the_same_requests_in_time():
    slow = make_workload(30, "chat", arrival="gamma", rate=1.0, burstiness=0.5, seed=2)
    fast = make_workload(30, "chat", arrival="gamma", rate=4.0, burstiness=0.5, seed=2)
    fixed = make_workload(30, "chat", arrival="fixed", rate=1.0, seed=2)
    lengths = [(r.prompt_len, r.max_new_tokens) for r in slow]
    assert lengths == [(r.prompt_len, r.max_new_tokens) for r in fast] \
        == [(r.prompt_len, r.max_new_tokens) for r in fixed]
    assert np.allclose([r.arrival_time for r in fast], [r.arrival_time / 4 for r in slow])


def test_explicit_lengths_replace_or_stand_without_a_preset():
    reqs = make_workload(5, prompt_len=10, output_len=Range(2, 3), arrival="at_once")
    assert {r.prompt_len for r in reqs} == {10}
    assert {r.max_new_tokens for r in reqs} <= {2, 3}
    reqs = make_workload(5, "prefill_heavy", output_len=4, arrival="at_once")
    assert {(r.prompt_len, r.max_new_tokens) for r in reqs} == {(400, 4)}
    preset = LengthPreset("tiny", "cpu", Fixed(3), Fixed(2))
    assert make_workload(2, preset, arrival="at_once")[0].max_total_tokens == 5


def test_sampled_requests_get_their_own_reproducible_seeds():
    sampled = make_workload(6, "chat", arrival="at_once", sampling=SamplingParams(0.8, 0.9), seed=1)
    seeds = [r.sampling.seed for r in sampled]
    assert all(isinstance(s, int) for s in seeds) and len(set(seeds)) == 6
    assert all((r.sampling.temperature, r.sampling.top_p) == (0.8, 0.9) for r in sampled)
    again = make_workload(6, "chat", arrival="at_once", sampling=SamplingParams(0.8, 0.9), seed=1)
    assert seeds == [r.sampling.seed for r in again]
    pinned = make_workload(3, "chat", arrival="at_once", sampling=SamplingParams(0.8, seed=5))
    assert {r.sampling.seed for r in pinned} == {5}


@pytest.mark.parametrize("kwargs, message", [
    (dict(n=0, preset="chat", arrival="at_once"), "n=0"),
    (dict(n=4, arrival="at_once"), "prompt_len=None; .*give both prompt_len= and output_len="),
    (dict(n=4, preset="chat", arrival="at_once", prompt_len=0), "prompt_len=0"),
    (dict(n=4, preset="chat", arrival="at_once", output_len="long"), "output_len='long'"),
    (dict(n=4, preset=3, arrival="at_once"), "preset=3"),
    (dict(n=4, preset="nope", arrival="at_once"), "preset='nope'; must be one of"),
    (dict(n=4, preset="chat", scale="huge", arrival="at_once"), "scale='huge'"),
    (dict(n=4, preset="chat", arrival="poisson"), "rate=None; .*needed by arrival='poisson'"),
    (dict(n=4, preset="chat", arrival="at_once", sampling={"temperature": 1}), "sampling="),
    (dict(n=4, preset="chat", arrival="at_once", tokenizer=WS, prompt_source=lambda n, r: [1] * n),
     "not both"),
    (dict(n=4, preset="chat", arrival="at_once", prompt_source=lambda n, r: [1] * (n + 1)),
     "returned .* ids; wanted a list of exactly"),
    (dict(n=4, preset="chat", arrival="at_once", tokenizer=lambda text: [-1] * 999),
     "token id -1 is outside the vocabulary"),
    (dict(n=4, preset="chat", arrival="at_once", id_prefix=7), "id_prefix=7"),
])
def test_make_workload_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_workload(**kwargs)


def test_bad_tokenizer_type_is_refused():
    with pytest.raises(ValueError, match=r"tokenizer=42; must be an object with an encode\(text\) method"):
        make_workload(2, "chat", arrival="at_once", tokenizer=42)


# ---------------------------------------------------------------------------------------------
# Prompts from the corpus
# ---------------------------------------------------------------------------------------------

def test_corpus_is_original_prose_of_about_four_thousand_words():
    words = CORPUS.split()
    assert 3500 <= len(words) <= 6000
    assert CORPUS.isascii()


def test_tokenized_prompts_are_exact_windows_of_corpus_text():
    reqs = make_workload(16, "chat", rate=2.0, seed=0, tokenizer=WS)
    for r in reqs:
        assert len(r.prompt_ids) == r.prompt_len
        assert all(0 <= t < WS.vocab_size for t in r.prompt_ids)
        words = WS.decode(r.prompt_ids)
        assert is_run_of_corpus_words(words[:-1])  # the last word may be cut mid-word
    assert len({tuple(r.prompt_ids[:8]) for r in reqs}) > 12  # different requests, different text


def test_prompt_text_depends_on_the_id_only():
    a = make_workload(4, prompt_len=30, output_len=1, arrival="at_once", tokenizer=WS, seed=0)
    b = make_workload(4, prompt_len=50, output_len=9, arrival="at_once", tokenizer=WS, seed=99)
    for ra, rb in zip(a, b):
        assert rb.prompt_ids[:30] == ra.prompt_ids  # same id: same start, longer window
    assert prompt_seed("r000") == prompt_seed("r000") != prompt_seed("r001")


def test_prompts_longer_than_the_corpus_wrap_around():
    length = len(CORPUS.split()) + 500
    ids = CorpusPrompts(WS)(length, np.random.default_rng(0))
    assert len(ids) == length
    assert is_run_of_corpus_words(WS.decode(ids)[:3000])


def test_plain_callable_and_custom_prompt_source():
    reqs = make_workload(3, prompt_len=20, output_len=2, arrival="at_once", tokenizer=WS.encode)
    assert [len(r.prompt_ids) for r in reqs] == [20, 20, 20]

    def counting_source(length, rng):
        start = int(rng.integers(1000))
        return list(range(start, start + length))

    reqs = make_workload(3, prompt_len=5, output_len=2, arrival="at_once", prompt_source=counting_source)
    start = int(np.random.default_rng(prompt_seed("r001")).integers(1000))
    assert reqs[1].prompt_ids == list(range(start, start + 5))


def test_hugging_face_tokenizer_gives_text_windows_without_special_tokens():
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    # A small byte-level BPE trained here, offline, on the corpus; it adds a BOS by default.
    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<bos>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(CORPUS.splitlines(), trainer)
    bpe.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<bos>")
    assert tok.encode("a river")[0] == 0  # the BOS that must not appear inside prompts

    reqs = make_workload(6, "prefill_heavy", scale="full", rate=1.0, tokenizer=tok)
    ring = CORPUS.strip() + "\n\n" + CORPUS.strip()
    for r in reqs:
        assert len(r.prompt_ids) == 2000 and 0 not in r.prompt_ids
        assert all(0 <= t < len(tok) for t in r.prompt_ids)
        assert tok.decode(r.prompt_ids) in ring


# ---------------------------------------------------------------------------------------------
# JSONL traces
# ---------------------------------------------------------------------------------------------

def test_save_load_round_trip(tmp_path):
    reqs = make_workload(10, "chat", arrival="gamma", rate=3.0, burstiness=0.5, seed=4,
                         sampling=SamplingParams(0.7, 0.95))
    reqs[3].stop_token_ids = (2, 5)
    path = save_workload(reqs, tmp_path / "w.jsonl", meta={"note": "test"})
    assert read_workload_header(path) == {"format": "batchlab-workload", "version": 1,
                                       "num_requests": 10, "meta": {"note": "test"}}
    loaded = load_workload(path)
    for a, b in zip(reqs, loaded, strict=True):
        assert (a.request_id, a.prompt_len, a.max_new_tokens, a.sampling, a.stop_token_ids) \
            == (b.request_id, b.prompt_len, b.max_new_tokens, b.sampling, b.stop_token_ids)
        assert b.arrival_time == pytest.approx(a.arrival_time, abs=1e-6)
        assert b.prompt_ids is None
    again = save_workload(loaded, tmp_path / "again.jsonl", meta={"note": "test"})
    assert again.read_bytes() == path.read_bytes()


def test_length_only_trace_rebuilds_the_same_prompts(tmp_path):
    direct = make_workload(8, "chat", rate=2.0, seed=3, tokenizer=WS)
    path = save_workload(make_workload(8, "chat", rate=2.0, seed=3), tmp_path / "w.jsonl")
    assert "prompt_ids" not in path.read_text()
    loaded = load_workload(path, tokenizer=WS)
    assert [r.prompt_ids for r in loaded] == [r.prompt_ids for r in direct]


def test_prompt_ids_can_be_stored(tmp_path):
    reqs = make_workload(3, prompt_len=6, output_len=2, arrival="at_once", tokenizer=WS)
    path = save_workload(reqs, tmp_path / "ids.jsonl", include_prompt_ids=True)
    assert [r.prompt_ids for r in load_workload(path)] == [r.prompt_ids for r in reqs]


def test_scale_arrivals_makes_fresh_copies():
    reqs = make_workload(5, "chat", rate=1.0, seed=0)
    reqs[0].output_ids.append(3)  # run state that must not be copied
    faster = scale_arrivals(reqs, 0.5)
    assert [r.arrival_time for r in faster] == [r.arrival_time * 0.5 for r in reqs]
    assert faster[0].output_ids == [] and reqs[0].output_ids == [3]
    assert [r.prompt_len for r in faster] == [r.prompt_len for r in reqs]
    for bad in (-1, math.nan, "2"):
        with pytest.raises(ValueError, match="factor="):
            scale_arrivals(reqs, bad)


HEADER = json.dumps({"format": "batchlab-workload", "version": 1, "num_requests": 2})
GOOD = '{"request_id": "a", "arrival_time": 0.5, "prompt_len": 4, "max_new_tokens": 2}'


def row(**changes) -> str:
    base = {"request_id": "b", "arrival_time": 1.0, "prompt_len": 4, "max_new_tokens": 2}
    base.update(changes)
    return json.dumps({k: v for k, v in base.items() if v is not ...})


@pytest.mark.parametrize("lines, message", [
    ([], "empty file"),
    ([GOOD, GOOD], ":1: the first line must be a header"),
    ([HEADER.replace('"version": 1', '"version": 2'), GOOD, row()], "version=2"),
    ([HEADER, "{not json", row()], ":2: not valid JSON"),
    ([HEADER, "[1, 2]", row()], ":2: must be a JSON object"),
    ([HEADER, GOOD, row(max_new_tokens=...)], ":3: missing max_new_tokens"),
    ([HEADER, GOOD, row(max_tokens=5)], ":3: unknown key\\(s\\) max_tokens"),
    ([HEADER, GOOD, row(request_id="")], ":3: request_id=''"),
    ([HEADER, GOOD, row(request_id="a")], ":3: request_id 'a' repeats line 2"),
    ([HEADER, GOOD, row(arrival_time=-1.0)], ":3: request 'b': arrival_time=-1.0"),
    ([HEADER, GOOD, row(arrival_time=0.25)], ":3: arrival_time=0.25 is earlier than the line before"),
    ([HEADER, GOOD, row(arrival_time="soon")], ":3: request 'b': arrival_time='soon'"),
    ([HEADER, GOOD, row(arrival_time=math.inf)], ":3: request 'b': arrival_time=inf"),
    ([HEADER, GOOD, row(prompt_len=0)], ":3: request 'b': prompt_len=0"),
    ([HEADER, GOOD, row(prompt_len=2.5)], ":3: request 'b': prompt_len=2.5"),
    ([HEADER, GOOD, row(max_new_tokens=True)], ":3: request 'b': max_new_tokens=True"),
    ([HEADER, GOOD, row(sampling={"temperature": -1})], ":3: temperature=-1"),
    ([HEADER, GOOD, row(sampling={"temp": 1})], ":3: sampling="),
    ([HEADER, GOOD, row(prompt_ids=[1, 2])], r":3: prompt_ids=\[1, 2\]; must be a list of 4 ints >= 0"),
    ([HEADER, GOOD, row(stop_token_ids=[-2])], ":3: stop_token_ids=\\[-2\\]"),
    ([HEADER, GOOD], "num_requests=2 but the file holds 1"),
])
def test_load_errors_name_the_line_and_value(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_workload(path)


def test_stored_prompt_ids_outside_the_vocabulary_are_refused(tmp_path):
    path = tmp_path / "vocab.jsonl"
    path.write_text("\n".join([HEADER.replace('"num_requests": 2', '"num_requests": 1'),
                               row(prompt_ids=[1, 2, 3, WS.vocab_size])]) + "\n")
    assert load_workload(path)[0].prompt_ids[-1] == WS.vocab_size  # no tokenizer: no vocab to check
    with pytest.raises(ValueError, match=f":2: .*token id {WS.vocab_size} is outside the vocabulary"):
        load_workload(path, tokenizer=WS)


# ---------------------------------------------------------------------------------------------
# The traces in data/
# ---------------------------------------------------------------------------------------------

def load_script():
    spec = importlib.util.spec_from_file_location("make_workloads", REPO / "scripts" / "make_workloads.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_data_traces_are_up_to_date_and_small(tmp_path):
    script = load_script()
    for path in script.write_workloads(tmp_path):
        stored = DATA / path.name
        assert stored.exists(), f"{stored} is missing; run python scripts/make_workloads.py"
        assert stored.read_bytes() == path.read_bytes(), \
            f"{stored} is stale; run python scripts/make_workloads.py"
        assert stored.stat().st_size < 200_000
        assert "prompt_ids" not in stored.read_text()


def test_cpu_traces_load_with_a_tokenizer():
    for path in sorted(DATA.glob("*_cpu.jsonl")):
        reqs = load_workload(path, tokenizer=WS)
        assert reqs and all(len(r.prompt_ids) == r.prompt_len for r in reqs)


def test_bursty_and_poisson_full_traces_hold_the_same_requests():
    poisson = load_workload(DATA / "chat_poisson_full.jsonl")
    bursty = load_workload(DATA / "bursty_chat_full.jsonl")
    assert [(r.prompt_len, r.max_new_tokens) for r in poisson] \
        == [(r.prompt_len, r.max_new_tokens) for r in bursty]
    assert gap_cv(np.array([r.arrival_time for r in bursty])) > 1.5 > \
        gap_cv(np.array([r.arrival_time for r in poisson]))
